"""Tool calls in the Hermes syntax (Qwen2.5, Qwen3, Hermes, and the templates modelled on them):
what the model is told, the grammar that holds it to the syntax, and its text read back as
OpenAI `tool_calls`. A front-end concern: the API uses it, and the CLI and the app could.

The syntax supported, the one these chat templates teach: an answer is either text, or one or
more calls separated by a newline, each

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with the arguments matching the named tool's JSON schema, written with ", " and ": " as
the templates' own `tojson` writes them (so the model stays in the format it was trained on).
`<tool_call>` and `</tool_call>` are the vocabulary's own tokens where it has them (Qwen's),
else plain text.

The grammar (Lark, llguidance's dialect) for each `tool_choice`: `auto` lets the model write text
(which may not start with `<tool_call>`) or calls; `required` only calls; a named function only
one call of it; `none` has no grammar, and the tools are not shown to the model, so it cannot
call one. `parallel_tool_calls: false` allows one call.

A template that does not read `tools` (it renders the same with and without them) gets them in
a system message in the same Hermes format instead, and the tool turns of the conversation
(assistant calls, `tool` results) as text in that format.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from engine.backend import Backend
from engine.grammar.spec import LARK, GrammarSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
AUTO, NONE, REQUIRED = "auto", "none", "required"
MODES = (AUTO, NONE, REQUIRED)
# How the templates' `tojson` separates items and keys: the grammar writes JSON the same way.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# A function's name as OpenAI allows it.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL = re.compile(r"\s*" + re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class Function:
    """One tool the model may call: OpenAI's `tools[i].function`."""
    name: str
    parameters: dict
    description: str | None = None

    def entry(self) -> dict:
        """The tool as OpenAI's `tools` entry (what chat templates read)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """auto, none, required, or `name`: that function only."""
    mode: str = AUTO
    name: str | None = None


@dataclass(frozen=True)
class Tools:
    functions: tuple[Function, ...]
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    @property
    def offered(self) -> bool:
        """Whether the model is shown the tools and may call them (not with `none`)."""
        return self.choice.mode != NONE


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    # The arguments as JSON text, as OpenAI sends them.
    arguments: str

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def tool_grammar(tools: Tools, tags_are_tokens: bool) -> GrammarSpec | None:
    """The grammar holding the answer to the syntax above, for `tools.choice`; None for `none`.
    `tags_are_tokens`: the vocabulary has <tool_call> and </tool_call> as tokens of their own."""
    if not tools.offered:
        return None
    named = tools.choice.name
    chosen = [f for f in tools.functions if named is None or f.name == named]
    schema = {"x-guidance": _JSON_STYLE, "anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
         "properties": {"name": {"const": f.name}, "arguments": f.parameters}} for f in chosen]}
    if tags_are_tokens:
        call = f'call: {OPEN} "\\n" body "\\n" {CLOSE}'
    else:
        call = f'call: "{OPEN}\\n" body "\\n{CLOSE}"'
    many = tools.parallel and named is None
    lines = [
        "start: TEXT | calls" if tools.choice.mode == AUTO and named is None else "start: calls",
        'calls: call ("\\n" call)*' if many else "calls: call",
        call,
        f"body: %json {json.dumps(schema)}",
        # Text that does not begin as a call does (the tag written out as plain text included).
        f"TEXT: /(?s:.+)/ & ~/(?s:\\s*{re.escape(OPEN)}.*)/",
    ]
    return GrammarSpec(LARK, "\n".join(lines) + "\n")


def tags_are_tokens(backend: Backend) -> bool:
    """Whether the vocabulary has the call tags as control tokens of their own (Qwen's)."""
    table = backend.token_table()
    tags = {OPEN.encode(), CLOSE.encode()}
    return tags <= {table.pieces[t] for t in table.control}


def describe(functions: Sequence[Function]) -> str:
    """The tools in a system message, in the Hermes format Qwen's template writes (the
    fallback for a template that does not read `tools`)."""
    listed = "\n".join(json.dumps(f.entry(), ensure_ascii=False) for f in functions)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listed}\n</tools>\n\nFor each function call, return a json object with "
            f"function name and arguments within {OPEN}{CLOSE} XML tags:\n{OPEN}\n"
            f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}')


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def as_text_turns(messages: Sequence[dict], functions: Sequence[Function]) -> list[dict]:
    """The conversation for a template that knows nothing of tools: the tools described in the
    system message, assistant calls and `tool` results written out in the Hermes format."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text, "tool_results": True})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], c["function"]["arguments"])
                     for c in m["tool_calls"]]
            out.append({"role": "assistant",
                        "content": "\n".join(([m["content"]] if m.get("content") else []) + calls)})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + describe(functions)},
                *out[1:]]
    return [{"role": "system", "content": describe(functions)}, *out]


def prompt_with_tools(backend: Backend, messages: Sequence[dict],
                      tools: Tools) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """(messages, tools) to render: the tools handed to the template when it reads them, else
    the Hermes fallback (`as_text_turns`) with no tools. With `none` the tools are not shown."""
    if not tools.offered:
        return tuple(messages), ()
    entries = [f.entry() for f in tools.functions]
    try:
        native = backend.chat_prompt(messages, entries) != backend.chat_prompt(messages)
    except Exception:  # noqa: BLE001 - a template that fails on tools or tool turns: the fallback
        native = False
    if native:
        return tuple(messages), tuple(entries)
    return tuple(as_text_turns(messages, tools.functions)), ()


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Call:
    index: int
    call: ToolCall


Piece = Content | Call


class CallReader:
    """Reads the model's answer as it is committed: text passes through as `Content`; an answer
    that begins with `<tool_call>` is held and handed out as one `Call` per complete call. What
    cannot be read as calls (an answer cut off by max_tokens) comes out as `Content` at the end,
    as it was written."""

    def __init__(self) -> None:
        self._held = ""
        self._calls = False
        self._decided = False
        self.n_calls = 0

    def push(self, text: str) -> list[Piece]:
        if self._decided and not self._calls:
            return [Content(text)] if text else []
        self._held += text
        if not self._decided:
            start = self._held.lstrip()
            if OPEN.startswith(start):
                return []  # could still become the tag
            self._decided = True
            self._calls = start.startswith(OPEN)
            if not self._calls:
                held, self._held = self._held, ""
                return [Content(held)]
        return self._complete_calls()

    def finish(self) -> list[Piece]:
        pieces = self._complete_calls() if self._calls else []
        held, self._held = self._held, ""
        if held.strip() or (held and not self._calls):
            pieces.append(Content(held))
        return pieces

    def _complete_calls(self) -> list[Piece]:
        pieces: list[Piece] = []
        while True:
            match = _CALL.match(self._held)
            if match is None:
                return pieces
            call = parse_call(match.group(1))
            if call is None:
                return pieces  # not a call: left to come out as text at the end
            pieces.append(Call(self.n_calls, call))
            self.n_calls += 1
            self._held = self._held[match.end():]


def parse_call(body: str) -> ToolCall | None:
    """One call's JSON ({"name": ..., "arguments": {...}}) as a ToolCall, or None."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id="call_" + uuid.uuid4().hex[:24], name=value["name"],
                    arguments=json.dumps(arguments, ensure_ascii=False))


def read_answer(text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole answer as (content, calls): content None when the answer is only calls."""
    reader = CallReader()
    pieces = reader.push(text) + reader.finish()
    calls = [p.call for p in pieces if isinstance(p, Call)]
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    return (content if content or not calls else None), calls
