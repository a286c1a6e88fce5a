"""Request bodies of /v1/chat/completions and /v1/completions, checked and turned into the
request spec the CLI and the page make too (app/runtime/request.py): the API's translation is
which field holds which setting of app/runtime/ranges.py, and the fields only the API has.

Every field is used or refused: a field outside the lists below, or a value out of its range,
is a 400 that names it (`param`), never silently dropped, since a client that sends
`presence_penalty` must learn that it had no effect. JSON null counts as absent, as the
OpenAI clients send it for unset options. `response_format` and the tool fields are read by
formats.py; `prediction` (OpenAI's predicted output) is the table's own row; log probabilities
are the `top_logprobs` row (chat: `logprobs: true` with
`top_logprobs` alternatives, 0 when not given; completions: `logprobs: N`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from app.runtime.defaults import OVERFLOW_API
from app.runtime.overflow import POLICIES as OVERFLOW_POLICIES
from app.runtime.ranges import BY_NAME, SETTINGS, SpecError
from app.runtime.reasoning import Thinking, checked_format
from app.runtime.request import Offer, RunSpec, resolve
from app.runtime.tool_calls import Tools
from app.runtime.tool_syntax import Syntax
from app.serve import formats
from app.serve.errors import BadRequestError
from app.serve.fields import boolean, integer, refuse_unknown
from engine.errors import SettingsError

SPECULATIVE = "speculative"
# The request settings (app/runtime/ranges.py) by the field a body gives them in: top-level, or
# inside the `speculative` object.
SETTING_FIELDS = {s.api_field: s.name for s in SETTINGS}
SPECULATIVE_FIELDS = tuple(f.partition(".")[2] for f in SETTING_FIELDS
                           if f.startswith(SPECULATIVE + "."))
TOP_LOGPROBS = BY_NAME["top_logprobs"].api_field
COMMON_FIELDS = ("model", *(f for f in SETTING_FIELDS if "." not in f and f != TOP_LOGPROBS),
                 "max_completion_tokens", "stream", "stream_options", "n", SPECULATIVE,
                 "response_format", "logprobs")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")
OVERFLOW_FIELD = "context_overflow"
# How a reasoning model's thinking is returned (app/runtime/reasoning.py), as llama-server's
# request field; absent: the server's --reasoning-format.
REASONING_FIELD = "reasoning_format"
CHAT_FIELDS = ("messages", *COMMON_FIELDS, TOP_LOGPROBS, *TOOL_FIELDS, OVERFLOW_FIELD,
               REASONING_FIELD)
# Tools on completions: the prompt describes them, the template's syntax holds the answer.
COMPLETION_FIELDS = ("prompt", *COMMON_FIELDS, *TOOL_FIELDS)
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
ROLES = ("system", "user", "assistant", "tool")
CALL_FIELDS = ("id", "type", "function")
# The deepest nesting a body may have: a request is four levels deep (body, messages, a message,
# its content parts); deeper is refused before any field is read, since Python's recursion (in the
# JSON parser, in repr) would fail on it long before the fields are checked.
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class GenerationRequest:
    kind: str  # "chat" or "completion"
    model: str | None
    # What to generate and how; its prompt is the chat messages, or the completion prompt
    # (decoded raw, without the chat template).
    spec: RunSpec
    stream: bool
    include_usage: bool
    # The tools offered; their grammar and rendering are set when the pair is known
    # (app/serve/routes.py `prepared`).
    tools: Tools | None = None
    # The template's call syntax, set with the tools' grammar.
    syntax: Syntax | None = None
    # What to do when a chat outgrows the context (app/runtime/overflow.py); the default
    # refuses with a 413, as llama-server does.
    overflow: str = OVERFLOW_API
    # The prediction's tokens, counted once when the pair is known and its fit checked
    # (app/serve/routes.py); None: not counted yet.
    prediction: tuple[int, ...] | None = None
    # The reasoning format the request asks for; None: the server's.
    reasoning_format: str | None = None
    # How the target's template thinks, set when the pair is known (app/serve/routes.py
    # `prepared`); None: the answer is not split (no thinking, or reasoning format none).
    thinking: Thinking | None = None


def parse_json(body: bytes) -> dict:
    too_deep = BadRequestError(f"the request body nests JSON more than {MAX_JSON_DEPTH} levels "
                               "deep", code="invalid_json")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}",
                              code="invalid_json") from None
    except RecursionError:
        raise too_deep from None
    if not isinstance(data, dict):
        raise BadRequestError("the request body must be a JSON object", code="invalid_json")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep
    return data


def json_depth(value: Any) -> int:
    """How deeply objects and arrays nest in `value` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_chat(body: dict, offer: Offer) -> GenerationRequest:
    refuse_unknown(body, CHAT_FIELDS)
    request = _request("chat", body, _messages(body.get("messages")), offer)
    return replace(request, overflow=_overflow(body.get(OVERFLOW_FIELD)),
                   reasoning_format=_reasoning_format(body.get(REASONING_FIELD)))


def _reasoning_format(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return checked_format(value, REASONING_FIELD)
    except SettingsError as exc:
        raise BadRequestError(str(exc), param=REASONING_FIELD) from None


def _overflow(value: Any) -> str:
    if value is None:
        return OVERFLOW_API
    if value not in OVERFLOW_POLICIES:
        raise BadRequestError(f"{OVERFLOW_FIELD} must be one of {', '.join(OVERFLOW_POLICIES)}, "
                              f"got {value!r}", param=OVERFLOW_FIELD)
    return str(value)


def parse_completion(body: dict, offer: Offer) -> GenerationRequest:
    refuse_unknown(body, COMPLETION_FIELDS)
    return _request("completion", body, _prompt(body.get("prompt")), offer)


def _request(kind: str, body: dict, prompt: str | tuple[dict, ...], offer: Offer) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequestError("model must be a string", param="model")
    n = integer(body, "n", 1)
    if n != 1:
        raise BadRequestError(f"n must be 1 (one choice per request), got {n}", param="n")
    stream = boolean(body, "stream", False)
    include_usage = _stream_options(body.get("stream_options"), stream)
    given, fields = _settings(body)
    _logprobs(body, kind, given, fields)
    grammar = formats.response_format(body.get("response_format"))
    tools = formats.tools(body)
    if grammar is not None and tools is not None and tools.offered:
        raise BadRequestError("response_format with tools is not supported: the answer is "
                              "either tool calls or the format; drop one (or tool_choice: none)",
                              param="response_format")
    try:
        spec = resolve(given, offer, prompt, raw=kind == "completion", grammar=grammar)
    except SpecError as exc:
        raise BadRequestError(str(exc), param=fields[exc.setting]) from None
    return GenerationRequest(kind=kind, model=model, spec=spec, stream=stream,
                             include_usage=include_usage, tools=tools)


def _logprobs(body: dict, kind: str, given: dict, fields: dict[str, str]) -> None:
    """The `top_logprobs` setting from the logprobs fields: chat's `logprobs: true` with
    `top_logprobs` (0 when absent), the legacy completions' `logprobs: N`."""
    if kind == "completion":
        given["top_logprobs"], fields["top_logprobs"] = body.get("logprobs"), "logprobs"
        return
    wanted = boolean(body, "logprobs", False)
    if given.get("top_logprobs") is not None and not wanted:
        raise BadRequestError("top_logprobs needs logprobs: true", param=TOP_LOGPROBS)
    if wanted and given.get("top_logprobs") is None:
        given["top_logprobs"] = 0


def _settings(body: dict) -> tuple[dict, dict[str, str]]:
    """The request settings the body gives, by name (app/runtime/ranges.py), and the field
    each was given in (a refusal's `param`)."""
    spec = body.get(SPECULATIVE)
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise BadRequestError(f"{SPECULATIVE} must be an object with "
                              f"{', '.join(SPECULATIVE_FIELDS)}", param=SPECULATIVE)
    refuse_unknown(spec, SPECULATIVE_FIELDS, prefix=SPECULATIVE + ".")
    given, fields = {}, {name: path for path, name in SETTING_FIELDS.items()}
    for path, name in SETTING_FIELDS.items():
        outer, _, inner = path.rpartition(".")
        given[name] = (spec if outer else body).get(inner)
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise BadRequestError("give max_tokens or max_completion_tokens, not both",
                                  param="max_completion_tokens")
        given["max_tokens"], fields["max_tokens"] = body["max_completion_tokens"], "max_completion_tokens"
    return given, fields


def _messages(value: Any) -> tuple[dict, ...]:
    if value is None:
        raise BadRequestError("messages is required", param="messages")
    if not isinstance(value, list) or not value:
        raise BadRequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequestError(f"{where} must be an object", param=where)
        refuse_unknown(message, MESSAGE_FIELDS, prefix=f"{where}.")
        role = message.get("role")
        if role not in ROLES:
            raise BadRequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}",
                                  param=f"{where}.role")
        out.append(_message(message, role, where))
    return tuple(out)


def _message(message: dict, role: str, where: str) -> dict:
    """One message as the chat template reads it: an assistant's tool calls with their
    arguments as objects (as Hugging Face templates expect), a tool result with its call's id."""
    out: dict[str, Any] = {"role": role}
    calls = message.get("tool_calls") if role == "assistant" else None
    if message.get("tool_calls") is not None and role != "assistant":
        raise BadRequestError(f"{where}.tool_calls is only allowed on assistant messages",
                              param=f"{where}.tool_calls")
    if calls is not None:
        out["tool_calls"] = _calls(calls, f"{where}.tool_calls")
        content = message.get("content")
        out["content"] = None if content is None else _content(content, f"{where}.content")
    else:
        out["content"] = _content(message.get("content"), f"{where}.content")
    _reasoning(message, role, where, out)
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise BadRequestError(f"{where}.name must be a string", param=f"{where}.name")
        out["name"] = name
    call_id = message.get("tool_call_id")
    if role == "tool":
        if not isinstance(call_id, str):
            raise BadRequestError(f"{where}.tool_call_id is required on tool messages (the id "
                                  "of the call it answers)", param=f"{where}.tool_call_id")
        out["tool_call_id"] = call_id
    elif call_id is not None:
        raise BadRequestError(f"{where}.tool_call_id is only allowed on tool messages",
                              param=f"{where}.tool_call_id")
    return out


def _reasoning(message: dict, role: str, where: str, out: dict) -> None:
    """An assistant turn's thinking, as this API returns it, handed to the template as its
    `reasoning_content` (Qwen3's renders it in the turns after the last question)."""
    value = message.get("reasoning_content")
    if value is None:
        return
    if role != "assistant" or not isinstance(value, str):
        raise BadRequestError(f"{where}.reasoning_content must be a string, on an assistant "
                              "message", param=f"{where}.reasoning_content")
    out["reasoning_content"] = value


def _calls(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadRequestError(f"{where} must be a non-empty list of calls", param=where)
    out = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise BadRequestError(f"{at} must be an object", param=at)
        refuse_unknown(call, CALL_FIELDS, prefix=at + ".")
        function = call.get("function")
        if not isinstance(call.get("id"), str) or call.get("type", "function") != "function" \
                or not isinstance(function, dict):
            raise BadRequestError(f'{at} must be {{"id": ..., "type": "function", "function": '
                                  '{"name": ..., "arguments": "{...}"}}', param=at)
        refuse_unknown(function, ("name", "arguments"), prefix=at + ".function.")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str):
            raise BadRequestError(f"{at}.function.name must be a string", param=f"{at}.function.name")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise BadRequestError(f"{at}.function.arguments must be a JSON object as a string",
                                  param=f"{at}.function.arguments")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": name, "arguments": parsed}})
    return out


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (the only kind a text model reads)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(text, str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequestError(f"{where}[{j}] must be a text part, got {kind!r}",
                                      param=f"{where}[{j}]")
            refuse_unknown(part, ("type", "text"), prefix=f"{where}[{j}].")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequestError(f"{where} must be a string or a list of text parts", param=where)


def _prompt(value: Any) -> str:
    # A list of one string is how some clients send a single prompt; batches are not served.
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None:
        raise BadRequestError("prompt is required", param="prompt")
    if not isinstance(value, str):
        raise BadRequestError("prompt must be a string (one prompt per request)", param="prompt")
    if not value:
        raise BadRequestError("prompt must not be empty", param="prompt")
    return value


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise BadRequestError("stream_options is only allowed with stream: true",
                              param="stream_options")
    if not isinstance(value, dict):
        raise BadRequestError("stream_options must be an object", param="stream_options")
    refuse_unknown(value, ("include_usage",), prefix="stream_options.")
    return boolean(value, "include_usage", False, name="stream_options.include_usage")
