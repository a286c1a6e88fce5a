"""Tools a request offers and how the model may use them (`tool_choice`,
`parallel_tool_calls`), the calls it made, and the prompt that shows it the tools. A front-end
concern: the API uses it, and the CLI and the app could.

The template's own call syntax (app/runtime/tool_syntax.py) is what the model is held to
(app/runtime/tool_grammar.py) and what its answer is read in (app/runtime/tool_reading.py).
A template that does not read `tools` (it renders the same with and without them) gets them in
a system message in the Hermes format instead, and the tool turns of the conversation
(assistant calls, `tool` results) as text in that format:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from app.runtime.tool_syntax import BY_NAME, HERMES, Syntax, detect
from engine.backend import Backend

OPEN, CLOSE = "<tool_call>", "</tool_call>"
AUTO, NONE, REQUIRED = "auto", "none", "required"
MODES = (AUTO, NONE, REQUIRED)
# A function's name as OpenAI allows it.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Function:
    """One tool the model may call: OpenAI's `tools[i].function`."""
    name: str
    parameters: dict
    description: str | None = None
    # False: the schema guides the model (it is shown) but its arguments are not held to it.
    strict: bool = True

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
    out = turns_as_text(messages)
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + describe(functions)},
                *out[1:]]
    return [{"role": "system", "content": describe(functions)}, *out]


def turns_as_text(messages: Sequence[dict]) -> list[dict]:
    """Assistant calls and `tool` results written out in the Hermes format, as plain turns."""
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
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out]


@dataclass(frozen=True)
class ToolPrompt:
    """What to render (messages, and the tools handed to the template) and the call syntax
    the answer is held to and read in."""
    messages: tuple[dict, ...]
    entries: tuple[dict, ...]
    syntax: Syntax


def prompt_with_tools(backend: Backend, messages: Sequence[dict], tools: Tools) -> ToolPrompt:
    """The tools handed to the template when it reads them, in its syntax; else the Hermes
    fallback (`as_text_turns`) with no tools. With `none` the tools are not shown, nor on the
    turn after their results where the row says so (`tools_after_results`): the turns then go
    as text, and the answer is still read in the row's syntax."""
    hermes = BY_NAME[HERMES]
    if not tools.offered:
        return ToolPrompt(tuple(messages), (), hermes)
    entries = [f.entry() for f in tools.functions]
    try:
        rendered = backend.chat_prompt(messages, entries)
        native = rendered != backend.chat_prompt(messages)
    except Exception:  # noqa: BLE001 - a template that fails on tools or tool turns: the fallback
        native = False
    if native:
        syntax = detect(rendered)
        if not syntax.tools_after_results and messages and messages[-1]["role"] == "tool":
            return ToolPrompt(tuple(turns_as_text(messages)), (), syntax)
        return ToolPrompt(tuple(messages), tuple(entries), syntax)
    return ToolPrompt(tuple(as_text_turns(messages, tools.functions)), (), hermes)


def template_syntax(backend: Backend, tools: Tools) -> Syntax | None:
    """The call syntax of the model's chat template, for a raw prompt (/v1/completions) that
    the caller wrote the tools into; None when the template does not read tools (or fails)."""
    probe = [{"role": "user", "content": "?"}]
    entries = [f.entry() for f in tools.functions]
    try:
        rendered = backend.chat_prompt(probe, entries)
        return detect(rendered) if rendered != backend.chat_prompt(probe) else None
    except Exception:  # noqa: BLE001 - no template, or one that fails on tools: none
        return None
