"""Request bodies of /v1/chat/completions and /v1/completions, checked and turned into the
request spec the CLI and the page make too (app/runtime/request.py): the API's translation is
which field holds which setting of app/runtime/ranges.py, and the fields only the API has.

Every field is used or refused: a field outside the lists below, or a value out of its range,
is a 400 that names it (`param`), never silently dropped, since a client that sends
`presence_penalty` or a tool schema must learn that it had no effect. JSON null counts as
absent, as the OpenAI clients send it for unset options.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.runtime.ranges import SETTINGS, SpecError
from app.runtime.request import Offer, RunSpec, resolve
from app.serve.errors import BadRequestError
from app.serve.fields import boolean, integer, refuse_unknown

SPECULATIVE = "speculative"
# The request settings (app/runtime/ranges.py) by the field a body gives them in: top-level, or
# inside the `speculative` object.
SETTING_FIELDS = {s.api_field: s.name for s in SETTINGS}
SPECULATIVE_FIELDS = tuple(f.partition(".")[2] for f in SETTING_FIELDS
                           if f.startswith(SPECULATIVE + "."))
COMMON_FIELDS = ("model", *(f for f in SETTING_FIELDS if "." not in f), "max_completion_tokens",
                 "stream", "stream_options", "n", SPECULATIVE)
CHAT_FIELDS = ("messages", *COMMON_FIELDS)
COMPLETION_FIELDS = ("prompt", *COMMON_FIELDS)
MESSAGE_FIELDS = ("role", "content")
ROLES = ("system", "user", "assistant")
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
    return _request("chat", body, _messages(body.get("messages")), offer)


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
    try:
        spec = resolve(given, offer, prompt, raw=kind == "completion")
    except SpecError as exc:
        raise BadRequestError(str(exc), param=fields[exc.setting]) from None
    return GenerationRequest(kind=kind, model=model, spec=spec, stream=stream,
                             include_usage=include_usage)


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
        out.append({"role": role, "content": _content(message.get("content"), f"{where}.content")})
    return tuple(out)


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
