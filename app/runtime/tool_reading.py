"""The model's answer read back as OpenAI tool calls, in the syntax of its template
(app/runtime/tool_syntax.py), whole or as it is drawn.

Text passes through as `Content` until a form's trigger (the pieces up to a function's name,
and the name of a tool offered) is written, a bare form's only at the answer's start; what could
still become a trigger is held back. From the trigger on the answer is
read as calls: a call is handed out (`Call`) once its name is known, its arguments as they are
drawn (`Arguments`), when the reader streams them: where a grammar holds the model to the
syntax, so what is drawn is the call's (a `strict: false` tool is read only once complete).
A call is a call only when it is complete, names a tool that was offered and its arguments
validate against that tool's schema; the first that is not, and everything after it, is text.
Text that merely holds JSON stays text.

A call identical to an earlier one in the same answer ends the calls (a small model under a
grammar that allows several may repeat itself until max_tokens): its arguments are held while
they could still be the earlier call's, and the call and what follows are dropped.
`ended` says so, for a caller that stops the generation there (app/serve/stream.py).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Callable, Collection

import jsonschema_rs

from app.runtime.tool_calls import Function, ToolCall, Tools
from app.runtime.tool_syntax import Form, Syntax

FULL, PARTIAL, NO = "full", "partial", "no"


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Call:
    """A call's head, sent once its name is known: its index, id and name."""
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    """More of call `index`'s arguments (JSON text)."""
    index: int
    text: str


Piece = Content | Call | Arguments


def pieces_at(text: str, pos: int, pieces: tuple[str, ...]) -> tuple[str, int]:
    """Whether `pieces` are written at `pos` (any whitespace before each): FULL with the end,
    PARTIAL when the text ends before they do, else NO."""
    for piece in pieces:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith(piece, pos):
            pos += len(piece)
        elif piece.startswith(text[pos:]):
            return PARTIAL, len(text)
        else:
            return NO, pos
    return FULL, pos


def value_end(text: str, pos: int) -> int | None:
    """The end of the JSON object at `pos` (after whitespace); None while it is unfinished,
    -1 when no object starts there."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos == len(text):
        return None
    if text[pos] != "{":
        return -1
    depth, in_string, escaped = 0, False, False
    for i in range(pos, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def trigger_at(form: Form, text: str, pos: int, names: Collection[str], at_start: bool) -> str:
    """Whether a call in `form` begins at `pos`: its trigger, then one of `names` closed (FULL),
    PARTIAL while the text could still become that, else NO. A bare form begins only at the
    answer's start (`at_start`: nothing but whitespace before `pos`)."""
    if form.anchored and not at_start:
        return NO
    state, at = pieces_at(text, pos, form.trigger)
    if state != FULL:
        return state
    rest, partial = text[at:], False
    for name in names:
        named = name + form.name_close
        if rest.startswith(named):
            return FULL
        partial = partial or named.startswith(rest)
    return PARTIAL if partial else NO


@dataclass
class Drawn:
    """One call as far as it is written: its name, its arguments' JSON text (None until they
    begin) and whether it is complete."""
    name: str
    # Where its opening begins, and where its close ends once complete.
    start: int = 0
    end: int = 0
    arguments: str | None = None
    complete: bool = False


@dataclass
class Scan:
    calls: list[Drawn] = field(default_factory=list)
    # FULL: complete calls and the block closed; PARTIAL: more may come; NO: what follows
    # the complete calls is not a call.
    state: str = PARTIAL


def scan(form: Form, text: str, pos: int) -> Scan:
    """The calls written from the trigger at `pos` on, in `form`."""
    out = Scan()
    state, pos = pieces_at(text, pos, form.head)
    while state == FULL:
        opens = form.call_open if not out.calls else form.sep + form.call_open
        state, at = pieces_at(text, pos, opens + form.trigger[len(form.head + form.call_open):])
        if state != FULL:
            closing, end = pieces_at(text, pos, form.tail)
            if out.calls and closing == FULL and not text[end:].strip():
                state = FULL
            break
        call, state, end = (_xml_call if form.xml else _json_call)(form, text, at)
        if call is not None:
            call.start, call.end = pos, end
            out.calls.append(call)
        pos = end
    out.state = state
    return out


def _json_call(form: Form, text: str, pos: int) -> tuple[Drawn | None, str, int]:
    end = text.find('"', pos)
    if end < 0:
        return None, PARTIAL, pos
    call = Drawn(text[pos:end])
    state, at = pieces_at(text, end + 1, (",", f'"{form.key}"', ":"))
    if state != FULL:
        return call, state, pos
    stop = value_end(text, at)
    start = at + len(text[at:]) - len(text[at:].lstrip())
    if stop is None or stop < 0:
        call.arguments = text[start:] if stop is None else None
        return call, PARTIAL if stop is None else NO, pos
    call.arguments = text[start:stop]
    state, after = pieces_at(text, stop, ("}",) + form.call_close)
    call.complete = state == FULL
    return call, state, after if state == FULL else pos


def _xml_call(form: Form, text: str, pos: int) -> tuple[Drawn | None, str, int]:
    """`NAME>` then `<parameter=P>value</parameter>`s, `</function>` and the close."""
    end = text.find(">", pos)
    if end < 0:
        return None, PARTIAL, pos
    call, args, at = Drawn(text[pos:end]), {}, end + 1
    while True:
        state, after = pieces_at(text, at, ("<parameter=",))
        if state != FULL:
            break
        close = text.find(">", after)
        stop = text.find("</parameter>", close) if close >= 0 else -1
        if stop < 0:
            return call, PARTIAL, pos
        name, raw = text[after:close], text[close + 1:stop].strip("\n")
        args[name] = _xml_value(raw)
        at = stop + len("</parameter>")
    state, after = pieces_at(text, at, ("</function>",) + form.call_close)
    if state == FULL:
        call.arguments, call.complete = json.dumps(args, ensure_ascii=False), True
        return call, FULL, after
    return call, state, pos


def _xml_value(raw: str) -> object:
    """A parameter's value: JSON where it reads as JSON (numbers, objects...), else the text."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def valid(call: Drawn, functions: dict[str, Function]) -> bool:
    """A complete call to an offered tool whose arguments validate against its schema."""
    function = functions.get(call.name)
    if function is None or not call.complete or call.arguments is None:
        return False
    try:
        arguments = json.loads(call.arguments)
        return isinstance(arguments, dict) and jsonschema_rs.is_valid(function.parameters,
                                                                      arguments)
    except (json.JSONDecodeError, ValueError):
        return False


class CallReader:
    """Reads an answer as it is committed (`push`), then its end (`finish`); see the module."""

    def __init__(self, syntax: Syntax, tools: Tools, stream_arguments: bool = False) -> None:
        self.syntax = syntax
        self.functions = {f.name: f for f in tools.functions
                          if tools.choice.name in (None, f.name)}
        self.parallel = tools.parallel
        self.stream_arguments = stream_arguments
        self.text = ""
        self.released = 0  # text before this is out as content
        self.form: Form | None = None
        self.start = 0  # where the calls begin
        self.sent: list[tuple[str, str]] = []  # each call's id and the arguments sent
        self.ended = False
        self.n_calls = 0
        self.first: int | None = None  # where the answer's first non-space is, once written

    def push(self, text: str) -> list[Piece]:
        self.text += text
        return self._read(final=False)

    def finish(self) -> list[Piece]:
        return self._read(final=True)

    def _read(self, final: bool) -> list[Piece]:
        if self.form is None:
            pieces = self._find_trigger(final)
            if self.form is None:
                return pieces
        else:
            pieces = []
        if self.ended:
            return pieces
        found = scan(self.form, self.text, self.start)
        pieces += self._calls(found, final)
        if final and not self.ended:
            tail = self.text[self._calls_end(found):]
            if tail.strip() or (tail and not self.sent):
                pieces.append(Content(tail))
        return pieces

    def _find_trigger(self, final: bool) -> list[Piece]:
        """Content up to the first trigger (or up to what could still become one)."""
        hold = len(self.text)
        first = self._first_word()
        for i in range(self.released, len(self.text)):
            for form in self.syntax.forms:
                state = trigger_at(form, self.text, i, self.functions, i <= first)
                if state == FULL:
                    self.form, self.start = form, i
                    return self._release(i)
                if state == PARTIAL and not final:
                    hold = min(hold, i)
            if hold < len(self.text):
                break
        return self._release(hold)

    def _first_word(self) -> int:
        if self.first is None:
            blank = len(self.text) - len(self.text.lstrip())
            if blank < len(self.text):
                self.first = blank
            return blank
        return self.first

    def _release(self, upto: int) -> list[Piece]:
        text, self.released = self.text[self.released:upto], max(self.released, upto)
        return [Content(text)] if text else []

    def _calls(self, found: Scan, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        for i, call in enumerate(found.calls):
            if i > 0 and not self.parallel:
                self.ended = True  # one call only
                break
            earlier = found.calls[:i]
            if call.complete and any(c.name == call.name and c.arguments == call.arguments
                                     for c in earlier):
                self.ended = True  # a repeat ends the calls
                break
            ok = call.complete and valid(call, self.functions)
            if not ok and (call.complete or final or call.name not in self.functions):
                break  # not a call: it and what follows are text (`finish`)
            pieces += self._send(i, call, earlier, ok)
            if not ok:
                break
        return pieces

    def _send(self, i: int, call: Drawn, earlier: list[Drawn], ok: bool) -> list[Piece]:
        """What is new of call `i`: its head, then its arguments (as drawn, or once valid)."""
        pieces: list[Piece] = []
        may_repeat = any(c.name == call.name and (c.arguments or "").startswith(call.arguments or "")
                         for c in earlier)
        if not (ok or (self.stream_arguments and not may_repeat)):
            return pieces
        if i == len(self.sent):
            self.sent.append(("call_" + uuid.uuid4().hex[:24], ""))
            self.n_calls += 1
            pieces.append(Call(i, self.sent[i][0], call.name))
        call_id, sent = self.sent[i]
        args = call.arguments or ""
        if ok and not sent:
            args = json.dumps(json.loads(args), ensure_ascii=False)  # sent whole: compact
        elif ok and not args.startswith(sent):
            args = sent  # sent whole before: nothing new
        if len(args) > len(sent):
            pieces.append(Arguments(i, args[len(sent):]))
            self.sent[i] = (call_id, args)
        return pieces

    def _calls_end(self, found: Scan) -> int:
        """Where the text after the calls sent begins: all of it when none was sent, none when
        every call was sent and the block closed."""
        if not self.sent:
            return self.released
        if found.state == FULL and len(self.sent) == len(found.calls):
            return len(self.text)
        last = found.calls[len(self.sent) - 1]
        return last.end if last.complete else last.start


def read_answer(text: str, syntax: Syntax, tools: Tools) -> tuple[str | None, list[ToolCall]]:
    """A whole answer as (content, calls): content None when the answer is only calls."""
    reader = CallReader(syntax, tools)
    pieces = reader.push(text) + reader.finish()
    calls: list[ToolCall] = []
    for p in pieces:
        if isinstance(p, Call):
            calls.append(ToolCall(p.id, p.name, ""))
        elif isinstance(p, Arguments):
            calls[p.index] = ToolCall(calls[p.index].id, calls[p.index].name,
                                      calls[p.index].arguments + p.text)
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    return (content if content or not calls else None), calls


def ends_calls(syntax: Syntax, tools: Tools) -> Callable[[], Callable[[str], bool]]:
    """Makes, for each generation, the rule that ends an answer whose calls have ended (a
    repeated call, or a second one where one is allowed): GenerationConfig.until."""
    def make() -> Callable[[str], bool]:
        reader = CallReader(syntax, tools)

        def until(text: str) -> bool:
            reader.push(text)
            return reader.ended
        return until
    return make
