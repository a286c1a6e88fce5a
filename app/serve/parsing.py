"""Request bodies of /v1/chat/completions and /v1/completions, checked and turned into the
engine's settings.

Every field is used or refused: a field outside the lists below, or a value out of its range,
is a 400 that names it (`param`), never silently dropped, since a client that sends
`presence_penalty` or a tool schema must learn that it had no effect. JSON null counts as
absent, as the OpenAI clients send it for unset options.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from app.serve.errors import BadRequestError
from app.serve.fields import boolean, integer, number, refuse_unknown
from app.runtime.defaults import (DEFAULT_GAMMA, DEFAULT_MAX_TOKENS, DEFAULT_POLICY, PLAIN,
                                  plain_alias)
from engine.errors import SettingsError
from engine.generation_config import MAX_GAMMA, GenerationConfig
from engine.control.registry import POLICIES
from engine.sampling import SamplingParams

COMMON_FIELDS = ("model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                 "min_p", "seed", "stop", "stream", "stream_options", "n", "speculative")
CHAT_FIELDS = ("messages", *COMMON_FIELDS)
COMPLETION_FIELDS = ("prompt", *COMMON_FIELDS)
SPECULATIVE_FIELDS = ("drafter", "policy", "gamma", "history")
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
    # Chat messages, or the completion prompt (decoded raw, without the chat template).
    prompt: str | tuple[dict, ...]
    config: GenerationConfig
    drafter: str
    # None with drafter "plain": plain decoding has no gamma policy.
    policy: str | None
    stream: bool
    include_usage: bool
    # Whether the request drafts from and is added to the caller's history of past requests
    # (`speculative.history`, default true; the server's --no-history overrides it).
    history: bool = True

    @property
    def raw(self) -> bool:
        return self.kind == "completion"


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


def parse_chat(body: dict, drafters: Sequence[str], default_drafter: str) -> GenerationRequest:
    refuse_unknown(body, CHAT_FIELDS)
    return _request("chat", body, _messages(body.get("messages")), drafters, default_drafter)


def parse_completion(body: dict, drafters: Sequence[str], default_drafter: str) -> GenerationRequest:
    refuse_unknown(body, COMPLETION_FIELDS)
    return _request("completion", body, _prompt(body.get("prompt")), drafters, default_drafter)


def _request(kind: str, body: dict, prompt: str | tuple[dict, ...], drafters: Sequence[str],
             default_drafter: str) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequestError("model must be a string", param="model")
    n = integer(body, "n", 1)
    if n != 1:
        raise BadRequestError(f"n must be 1 (one choice per request), got {n}", param="n")
    stream = boolean(body, "stream", False)
    include_usage = _stream_options(body.get("stream_options"), stream)
    drafter, policy, gamma = _speculative(body.get("speculative"), drafters, default_drafter)
    history = boolean(body.get("speculative") or {}, "history", True, name="speculative.history")
    try:
        params = SamplingParams(
            temperature=number(body, "temperature", 0.0, low=0.0),
            top_k=integer(body, "top_k", 0, low=0),
            top_p=number(body, "top_p", 1.0, low=0.0, high=1.0, open_low=True),
            min_p=number(body, "min_p", 0.0, low=0.0, high=1.0, open_high=True),
            seed=integer(body, "seed", None))
        config = GenerationConfig(params=params, gamma=gamma, max_tokens=_max_tokens(body),
                                  stop=_stop(body.get("stop")))
    except SettingsError as exc:  # the checks above should have caught it; say it anyway
        raise BadRequestError(str(exc)) from None
    return GenerationRequest(kind=kind, model=model, prompt=prompt, config=config,
                             drafter=drafter, policy=policy, stream=stream,
                             include_usage=include_usage, history=history)


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


def _speculative(value: Any, drafters: Sequence[str], default_drafter: str) -> tuple[str, str | None, int]:
    """(drafter, policy, gamma) from the `speculative` object; gamma 0 with drafter plain."""
    spec = {} if value is None else value
    if not isinstance(spec, dict):
        raise BadRequestError("speculative must be an object with drafter, policy and gamma",
                              param="speculative")
    refuse_unknown(spec, SPECULATIVE_FIELDS, prefix="speculative.")
    drafter = default_drafter if spec.get("drafter") is None else plain_alias(spec["drafter"])
    if drafter not in drafters:
        raise BadRequestError(f"speculative.drafter must be one of {', '.join(drafters)} with "
                              f"the loaded pair, got {drafter!r}", param="speculative.drafter")
    if drafter == PLAIN:
        for key in ("policy", "gamma"):
            if spec.get(key) is not None:
                raise BadRequestError(f"speculative.{key} has no effect with drafter {PLAIN} "
                                      "(plain decoding); drop it", param=f"speculative.{key}")
        return drafter, None, 0
    policy = DEFAULT_POLICY if spec.get("policy") is None else spec["policy"]
    if policy not in POLICIES:
        raise BadRequestError(f"speculative.policy must be one of {', '.join(POLICIES)}, got "
                              f"{policy!r}", param="speculative.policy")
    gamma = integer(spec, "gamma", DEFAULT_GAMMA[policy], low=1, high=MAX_GAMMA,
                     name="speculative.gamma")
    return drafter, policy, gamma


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


def _max_tokens(body: dict) -> int:
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise BadRequestError("give max_tokens or max_completion_tokens, not both",
                              param="max_completion_tokens")
    name = "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"
    return integer(body, name, DEFAULT_MAX_TOKENS, low=1)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequestError("stop must be a non-empty string or a list of them", param="stop")
    return tuple(items)
