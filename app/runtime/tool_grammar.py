"""The grammar (Lark, llguidance's dialect) that holds an answer to a template's tool-call
syntax (app/runtime/tool_syntax.py) for each `tool_choice`.

- `auto` is lazy, as llama.cpp's tool grammars are: the answer is free text until a form's
  trigger (the pieces up to a function's name and a tool's name, e.g.
  `<tool_call>{"name": "get_weather"`; a bare form's only at the start) is written; from there
  it is calls to the tools offered and nothing after them. Text without a trigger ends as it
  likes; text that merely holds JSON is not a trigger. Where the form's first piece is a control
  token (`<tool_call>` in Qwen's vocabulary) that token is the trigger.
- `required` is calls from the first token; a named function, calls of it only.
- One call, unless parallel calls are allowed (`parallel_tool_calls`; for `required` and a
  named function only when asked for, app/serve/formats.py).
- `none` has no grammar.

A tool whose `strict` is false is guided, not enforced: its call must have the syntax, but its
arguments may be any JSON object (the reader then keeps it only if they validate). A piece the
vocabulary has as a control token is that token (`<[id]>`), as the model was trained to write it.
Whitespace between pieces and inside the JSON is the model's own choice.
"""
from __future__ import annotations

import json
import re
from typing import Mapping

from app.runtime.tool_calls import AUTO, Function, Tools
from app.runtime.tool_syntax import Form, Syntax
from engine.backend import Backend
from engine.grammar.spec import LARK, GrammarSpec

# Whitespace where the syntax allows it: the model's own choice, bounded so a model cannot
# write whitespace for ever (enough for pretty-printed arguments a few levels deep).
SPACE = r"[ \t\r\n]{0,24}"
_JSON_STYLE = {"whitespace_flexible": True, "whitespace_pattern": SPACE}
_ANY_OBJECT = {"type": "object"}


def control_tokens(backend: Backend, syntax: Syntax) -> dict[str, int]:
    """The syntax's pieces that the vocabulary has as control tokens, with their ids."""
    table = backend.token_table()
    wanted = {p.encode() for form in syntax.forms for p in form.pieces}
    return {table.pieces[t].decode(): t for t in table.control if table.pieces[t] in wanted}


def tool_grammar(syntax: Syntax, tools: Tools, tokens: Mapping[str, int]) -> GrammarSpec | None:
    """The grammar for `tools.choice` in `syntax`; None for `none`."""
    if not tools.offered:
        return None
    named = tools.choice.name
    functions = [f for f in tools.functions if named is None or f.name == named]
    lazy = tools.choice.mode == AUTO and named is None
    lines: list[str] = []
    starts = []
    avoid: dict[bool, list[str]] = {False: [], True: []}
    for k, form in enumerate(syntax.forms):
        lines += _form_rules(f"f{k}", form, functions, tools.parallel, tokens)
        if not lazy:
            starts.append(f"f{k}_block")
        elif form.trigger[0] in tokens:
            starts.append(f"f{k}_block" if form.anchored else f"TEXT? f{k}_block")
        else:
            leads, rules = _leads(f"f{k}", form, functions)
            lines += rules
            starts += leads
            avoid[form.anchored] += [_named(form, f) for f in functions]
    if lazy:
        starts.insert(0, "TEXT")
        lines.append(f"TEXT: /(?s:.+)/ & ~/{_avoided(avoid[False], avoid[True])}/")
    lines.insert(0, "start: " + " | ".join(starts))
    lines.append("WS: /[ \\t\\r\\n]{1,24}/")
    return GrammarSpec(LARK, "\n".join(lines) + "\n")


def _leads(p: str, form: Form, functions: list[Function]) -> tuple[list[str], list[str]]:
    """Under `auto`, where a form's trigger is text: one lead per function, the text up to its
    trigger and the function's name (lazy: the first such place; a bare form's only at the
    start), then the rest of its call and of the calls."""
    starts, lines = [], []
    for i, function in enumerate(functions):
        pattern = _named(form, function)
        # Lazy: it ends where it first matches, though a longer lead could still match.
        lines.append(f"{p}_lead{i}[lazy]: /{'' if form.anchored else '(?s:.*)'}{pattern}/")
        starts.append(f"{p}_lead{i} {p}_call{i}_body {p}_more")
    return starts, lines


def _named(form: Form, function: Function) -> str:
    """The regular expression of a call's trigger and `function`'s name."""
    return _slashed(_regex(form.trigger) + re.escape(function.name + form.name_close))


def _avoided(anywhere: list[str], at_start: list[str]) -> str:
    """What free text may not be: text holding a trigger, or beginning with a bare one."""
    excluded = ([f"(?s:.*({'|'.join(anywhere)}).*)"] if anywhere else []) + \
        ([f"(?s:({'|'.join(at_start)}).*)"] if at_start else [])
    return "|".join(excluded) or "[^\\s\\S]"


def _form_rules(p: str, form: Form, functions: list[Function], parallel: bool,
                tokens: Mapping[str, int]) -> list[str]:
    """A form's rules: `p_block` (all its calls), `p_more` (what follows the first call), one
    `p_call_i` per function (a call after its trigger) and `p_call_i_body` (after its name)."""
    calls = []
    lines = []
    for i, function in enumerate(functions):
        lines += _call_rules(f"{p}_call{i}", form, function, tokens)
        calls.append(f"{p}_call{i}")
    more = _sequence(form.sep + form.trigger[len(form.head):], tokens)
    tail = _sequence(form.tail, tokens)
    lines.append(f"{p}_one: " + " | ".join(calls))
    rest = f"({more} {p}_one)*" if parallel else ""
    lines.append(f"{p}_more: {rest} {tail} WS?")
    lines.append(f"{p}_block: {_sequence(form.trigger, tokens)} {p}_one {p}_more")
    return lines


def _call_rules(rule: str, form: Form, function: Function,
                tokens: Mapping[str, int]) -> list[str]:
    """One call of `function` from its name on (`rule`) and after its name (`rule_body`)."""
    close = _sequence(("}",) + form.call_close if not form.xml else
                      ("</function>",) + form.call_close, tokens)
    name = f"{rule}: /{_slashed(re.escape(function.name + form.name_close))}/ {rule}_body"
    if not form.xml:
        schema = function.parameters if function.strict else _ANY_OBJECT
        head = _regex((",", f'"{form.key}"', ":")) + SPACE
        return [name, f"{rule}_body: /{_slashed(head)}/ {rule}_args {close}",
                f"{rule}_args: %json {json.dumps(_styled(schema))}"]
    return [name, *_xml_rules(rule, function, close)]


def _xml_rules(rule: str, function: Function, close: str) -> list[str]:
    """Each parameter in the schema's order (the required ones must be there), a string as its
    text, anything else as JSON, then the close."""
    schema = function.parameters if function.strict else _ANY_OBJECT
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    required = set(schema.get("required", ())) if isinstance(schema, dict) else set()
    lines, parts = [], []
    for j, (name, prop) in enumerate(properties.items()):
        opener = _slashed(_regex((f"<parameter={name}>",)))
        if isinstance(prop, dict) and prop.get("type") not in (None, "string"):
            lines.append(f"{rule}_p{j}: /{opener}{SPACE}/ %json {json.dumps(_styled(prop))} "
                         f"/{_slashed(_regex(('</parameter>',)))}/")
        else:
            lines.append(f"{rule}_p{j}[lazy]: /{opener}(?s:.*)<\\/parameter>/")
        parts.append(f"{rule}_p{j}" + ("" if name in required else "?"))
    return [f"{rule}_body: {' '.join(parts)} {close}", *lines]


def _styled(schema: dict) -> dict:
    return {"x-guidance": _JSON_STYLE, **schema} if isinstance(schema, dict) else schema


def _regex(pieces: tuple[str, ...]) -> str:
    """Text pieces as one regular expression, any whitespace before each."""
    return "".join(SPACE + re.escape(p) for p in pieces)


def _slashed(pattern: str) -> str:
    return pattern.replace("/", "\\/")


def _sequence(pieces: tuple[str, ...], tokens: Mapping[str, int]) -> str:
    """Pieces as Lark items: runs of text as one regex, control tokens as `<[id]>`."""
    items: list[str] = []
    run: list[str] = []
    for piece in pieces:
        if piece in tokens:
            if run:
                items.append(f"/{_slashed(_regex(tuple(run)))}/")
                run = []
            items.append(f"WS? <[{tokens[piece]}]>")
        else:
            run.append(piece)
    if run:
        items.append(f"/{_slashed(_regex(tuple(run)))}/")
    return " ".join(items)
