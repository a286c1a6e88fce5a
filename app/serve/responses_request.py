"""Request bodies of /v1/responses (OpenAI's Responses API), read as the chat request they
amount to, so they go through the same request table (app/serve/parsing.py `parse_chat`): the
same settings, ranges, tools and formats, and the same refusals.

The translation: `instructions` is a system message first; `input` is a string (one user
message) or a list of items: messages (`role` user, system, developer (a system message) or
assistant; `content` a string or `input_text` / `output_text` parts), `function_call` items
(consecutive ones are one assistant turn's calls) and `function_call_output` items (a tool
message). Function `tools` are flat (`{"type": "function", "name", "parameters", ...}`),
`tool_choice` names a function as `{"type": "function", "name": ...}`, `text.format` is
`response_format`, `max_output_tokens` is `max_tokens`; `include` may only be empty.
A request that continues a stored response (`previous_response_id`, app/serve/responses_kept.py)
is read with that response's conversation (its items, then its output) before its own input.
"""
from __future__ import annotations

from typing import Any, Sequence

from app.runtime.request import Offer
from app.serve.errors import BadRequestError
from app.serve.fields import refuse_unknown
from app.serve.parsing import COMMON_FIELDS, GenerationRequest, parse_chat

# Fields passed to the chat request as they are (the request settings and the API's own).
PASSED = tuple(f for f in COMMON_FIELDS if f not in ("max_tokens", "max_completion_tokens",
                                                    "response_format", "logprobs", "n",
                                                    "stream_options"))
RESPONSES_FIELDS = ("input", "instructions", "max_output_tokens", "tools", "tool_choice",
                    "parallel_tool_calls", "text", "store", "metadata", "include",
                    "previous_response_id", *PASSED)
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
PART_TYPES = ("input_text", "output_text", "text")
ITEM_FIELDS = {"message": ("type", "role", "content", "id", "status"),
               "function_call": ("type", "call_id", "name", "arguments", "id", "status"),
               "function_call_output": ("type", "call_id", "output", "id", "status"),
               # A reasoning model's thinking, as this API returns it (app/runtime/reasoning.py).
               "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status")}
FORMAT_FIELDS = ("type", "name", "schema", "strict", "description")


def parse_responses(body: dict, offer: Offer, earlier: Sequence[dict] = ()) -> GenerationRequest:
    """The chat request `body` amounts to, after the items of the conversation it continues."""
    refuse_unknown(body, RESPONSES_FIELDS)
    if not isinstance(body.get("store", True), bool):
        raise BadRequestError("store must be true or false", param="store")
    if body.get("include"):
        raise BadRequestError("include asks for output this server does not have (reasoning, "
                              "search results...); send an empty list", param="include")
    chat: dict[str, Any] = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = _messages(body.get("instructions"), [*earlier, *input_items(body)],
                                 len(earlier))
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("parallel_tool_calls",):
        if key in body:
            chat[key] = body[key]
    # An empty list is no tools, as OpenAI's Responses API reads it (the Agents SDK sends
    # `tools: []` for an agent without tools).
    if body.get("tools") is not None and body["tools"] != []:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return parse_chat(chat, offer)


def input_items(body: dict) -> list:
    """The request's `input` as a list of items (a string is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRequestError("input must be a string or a non-empty list of items",
                              param="input")
    return value


def _messages(instructions: Any, items: list, earlier: int) -> list[dict]:
    """Chat messages of the items; the first `earlier` are a stored conversation's."""
    out: list[dict] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequestError("instructions must be a string", param="instructions")
        out.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        where = f"input[{i - earlier}]" if i >= earlier else f"previous_response_id item {i}"
        if not isinstance(item, dict):
            raise BadRequestError(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind not in ITEM_FIELDS:
            raise BadRequestError(f"{where}.type must be one of {', '.join(ITEM_FIELDS)}, got "
                                  f"{kind!r:.80}", param=f"{where}.type")
        refuse_unknown(item, ITEM_FIELDS[kind], prefix=where + ".")
        out = _add_item(out, kind, item, where)
    return out


def _add_item(out: list[dict], kind: str, item: dict, where: str) -> list[dict]:
    """The chat messages with one more input item; an earlier turn's thinking is left out, as
    the templates of the models that think leave it out."""
    if kind == "reasoning":
        return out
    if kind == "message":
        role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise BadRequestError(f"{where}.role must be one of {', '.join(ROLES)}",
                                  param=f"{where}.role")
        return out + [{"role": role, "content": _content(item.get("content"), where)}]
    call_id = item.get("call_id")
    if kind == "function_call_output":
        output = item.get("output")
        return out + [{"role": "tool", "tool_call_id": call_id,
                       "content": output if isinstance(output, str) else _content(output, where)}]
    call = {"id": call_id, "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
    if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
        return out[:-1] + [{**out[-1], "tool_calls": out[-1]["tool_calls"] + [call]}]
    return out + [{"role": "assistant", "content": None, "tool_calls": [call]}]


def _content(value: Any, where: str) -> Any:
    """A message's content as chat content: a string, or its text parts as chat text parts."""
    if not isinstance(value, list):
        return value
    parts = []
    for j, part in enumerate(value):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
            raise BadRequestError(f"{at} must be a text part ({', '.join(PART_TYPES)})", param=at)
        refuse_unknown(part, ("type", "text", "annotations", "logprobs"), prefix=at + ".")
        parts.append({"type": "text", "text": part.get("text")})
    return parts


def _tools(value: Any) -> Any:
    """Flat function tools as chat tools (anything else is left for the chat reader to refuse)."""
    if not isinstance(value, list):
        return value
    out = []
    for tool in value:
        if isinstance(tool, dict) and tool.get("type") == "function":
            function = {k: v for k, v in tool.items() if k != "type"}
            out.append({"type": "function", "function": function})
        else:
            out.append(tool)
    return out


def _tool_choice(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function" and "name" in value:
        return {"type": "function", "function": {"name": value["name"]}}
    return value


def _format(value: Any) -> dict | None:
    """`text: {"format": {...}}` as `response_format`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequestError('text must be an object like {"format": {"type": "text"}}',
                              param="text")
    refuse_unknown(value, ("format",), prefix="text.")
    fmt = value.get("format")
    if not isinstance(fmt, dict):
        return None if fmt is None else {"type": fmt}
    refuse_unknown(fmt, FORMAT_FIELDS, prefix="text.format.")
    if fmt.get("type") != "json_schema":
        return {"type": fmt.get("type")}
    return {"type": "json_schema",
            "json_schema": {k: fmt[k] for k in FORMAT_FIELDS[1:] if k in fmt}}

