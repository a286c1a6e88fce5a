"""Reasoning models' thinking (Qwen3, QwQ, DeepSeek-R1 and its distills): text between
`<think>` and `</think>` before the answer, which the API returns apart from the answer
(`reasoning_content`, Responses' reasoning items) and the page shows folded, as llama-server's
`--reasoning-format deepseek` and LM Studio do.

Whether a model thinks is read from its chat template, by rendering two probes
(`template_thinking`): a template that thinks drops the thinking of the conversation's earlier
assistant turns (keeping their answers), or opens the thinking in its generation prompt (the
answer then starts inside it: DeepSeek-R1's and QwQ's templates, llama.cpp's
`thinking_forced_open`). `--reasoning-format none` (or a request's `reasoning_format`) passes
the tags through as text.

The answer is split as it is drawn (`ThoughtReader`): where it opens the thinking (after any
whitespace, or from the start when the prompt opened it), the text up to `</think>` is the
thinking, trimmed, and what follows its whitespace is the answer; an answer that does not open
it is all answer, and one that never closes it is all thinking.

A grammar (a JSON schema, a tool-call syntax) holds the answer after the thinking: the
grammar is led by the thinking's own rules (`after_thinking`: the thought, free text without
`</think>`, then the close and whitespace), so drafting and verifying both see the same
constrained p and q in the thinking as in the answer.
"""
from __future__ import annotations

import codecs
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from app.runtime.defaults import REASONING_FORMAT, REASONING_FORMATS, REASONING_NONE
from app.runtime.tool_reading import Content, Piece
from engine.backend import Backend
from engine.errors import SettingsError
from engine.grammar.spec import GrammarSpec

OPEN, CLOSE = "<think>", "</think>"
# What the probes write as an earlier turn's thinking and answer.
_THOUGHT, _ANSWER = "tandem probe thought", "tandem probe answer"
_ASKED = {"role": "user", "content": "?"}
# Whitespace between the thought's close and a constrained answer, bounded as the tool
# grammar's is (app/runtime/tool_grammar.py).
_GAP = "WS: /[ \\t\\r\\n]{1,24}/"


@dataclass(frozen=True)
class Reasoning:
    """A piece of the thinking, as drawn."""
    text: str


@dataclass(frozen=True)
class Thinking:
    """A model that thinks in OPEN ... CLOSE; `opened`: its generation prompt opens the
    thinking, so the answer starts inside it."""
    opened: bool = False


_FOUND: "weakref.WeakKeyDictionary[Any, Thinking | None]" = weakref.WeakKeyDictionary()


def template_thinking(backend: Backend) -> Thinking | None:
    """How the backend's chat template thinks, None when it does not (or cannot render):
    read once per loaded model."""
    try:
        if backend in _FOUND:
            return _FOUND[backend]
    except TypeError:  # a backend that cannot be weakly referenced: read it each time
        return _read_thinking(backend)
    found = _FOUND[backend] = _read_thinking(backend)
    return found


def _read_thinking(backend: Backend) -> Thinking | None:
    """The two probes: the generation prompt, and an earlier turn that thought."""
    earlier = {"role": "assistant", "content": f"{OPEN}\n{_THOUGHT}\n{CLOSE}\n\n{_ANSWER}"}
    try:
        prompt = backend.chat_prompt([_ASKED])
        past = backend.chat_prompt([_ASKED, earlier, _ASKED])
    except Exception:  # noqa: BLE001 - no template, or one that fails on the probe: no thinking
        found = None
    else:
        opened = prompt.rstrip().endswith(OPEN)
        drops = _ANSWER in past and _THOUGHT not in past
        found = Thinking(opened) if opened or drops else None
    return found


def checked_format(value: object, where: str = "reasoning format") -> str:
    """A reasoning format by name; SettingsError in one line otherwise."""
    if value not in REASONING_FORMATS:
        raise SettingsError(f"{where} must be one of {', '.join(REASONING_FORMATS)}, got "
                            f"{value!r:.80}")
    return str(value)


def thinking_for(backend: Backend, fmt: str | None = REASONING_FORMAT) -> Thinking | None:
    """The thinking to split off the answers of `backend` under the reasoning format `fmt`."""
    return None if fmt == REASONING_NONE else template_thinking(backend)


class ThoughtReader:
    """Reads an answer as it is drawn (`push`, then `finish`) into `Reasoning` pieces and the
    answer's, which `inner` (a tool-call reader) reads further when given, else `Content`."""

    def __init__(self, thinking: Thinking, inner: Any = None) -> None:
        self.inner = inner
        self.state = "thought" if thinking.opened else "start"
        self.text = ""
        self.pending = ""  # a suffix of `text` not yet handed out
        self.started = False  # whether any thinking was handed out
        # Whether the answer thinks (the prompt opened the thinking, or the answer did).
        self.thought = thinking.opened
        # Where the thinking ends in `text` (its close), once closed.
        self.end: int | None = None

    def push(self, text: str) -> list[Piece | Reasoning]:
        self.text += text
        self.pending += text
        return self._read(final=False)

    def finish(self) -> list[Piece | Reasoning]:
        pieces = self._read(final=True)
        if self.state == "thought":
            pieces += self._reason(self.pending.rstrip())
        elif self.state == "start" and self.pending:
            pieces += self._answer(self.pending)
        self.pending = ""
        return pieces + (self.inner.finish() if self.inner is not None else [])

    def _read(self, final: bool) -> list[Piece | Reasoning]:
        pieces: list[Piece | Reasoning] = []
        while self.pending:
            if self.state == "start":
                head = self.pending.lstrip()
                if head.startswith(OPEN):
                    self.state, self.pending = "thought", head[len(OPEN):]
                    self.thought = True
                elif not OPEN.startswith(head) or final:
                    self.state = "answer"
                else:
                    break  # could still open the thinking
            elif self.state == "thought":
                at = self.pending.find(CLOSE)
                if at < 0:
                    keep = _held(self.pending)
                    pieces += self._reason(self.pending[:len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep:]
                    break
                pieces += self._reason(self.pending[:at].rstrip())
                self.end = len(self.text) - len(self.pending) + at + len(CLOSE)
                self.state, self.pending = "gap", self.pending[at + len(CLOSE):]
            elif self.state == "gap":
                rest = self.pending.lstrip()
                self.pending = rest
                if not rest:
                    break
                self.state = "answer"
            else:
                pieces += self._answer(self.pending)
                self.pending = ""
        return pieces

    def _reason(self, text: str) -> list[Piece | Reasoning]:
        if not self.started:
            text = text.lstrip()
        if not text:
            return []
        self.started = True
        return [Reasoning(text)]

    def _answer(self, text: str) -> list[Piece | Reasoning]:
        if self.inner is not None:
            return list(self.inner.push(text))
        return [Content(text)]


def _held(text: str) -> int:
    """How much of the thinking's end to hold back: what could still become CLOSE, and the
    whitespace before it (the thinking is handed out trimmed)."""
    keep = next((k for k in range(min(len(CLOSE) - 1, len(text)), 0, -1)
                 if text.endswith(CLOSE[:k])), 0)
    return len(text) - len(text[:len(text) - keep].rstrip())


def split(text: str, thinking: Thinking | None) -> tuple[str | None, str]:
    """A whole answer as (its thinking, None when it did not think; the rest)."""
    if thinking is None:
        return None, text
    reader = ThoughtReader(thinking)
    pieces = reader.push(text) + reader.finish()
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    return (reasoning if reader.thought else None), content


def thought_tokens(thinking: Thinking | None, text: str, tokens: Sequence[int],
                   token_bytes: Callable[[int], bytes]) -> int:
    """How many of an answer's tokens are its thinking: those up to the one that closes it (its
    close included), all of them when it never closes, none when it did not think."""
    if thinking is None:
        return 0
    reader = ThoughtReader(thinking)
    reader.push(text)
    reader.finish()
    if not reader.thought:
        return 0
    end = reader.end if reader.end is not None else len(text)
    wanted, n, seen = len(text[:end].encode("utf-8")), 0, 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in tokens:
        if seen >= wanted:
            break
        seen += len(decoder.decode(token_bytes(token)).encode("utf-8"))
        n += 1
    return n


def thinking_lead(thinking: Thinking, control: Mapping[str, int]) -> str:
    """The Lark rules (llguidance's dialect) of the thinking before a grammar's answer
    (`@answer`): the thought, whose text never holds CLOSE, the close, whitespace. A tag the
    vocabulary has as a control token (`control`: its id) is that token, as the model writes
    it; else its text."""
    o, c = control.get(OPEN), control.get(CLOSE)
    if c is not None:
        # Text cannot spell the control token; nor may it spell the close as text.
        lines = [f"thought_close: THOUGHT? <[{c}]>", "THOUGHT: /(?s:.+)/ & ~/(?s:.*<\\/think>.*)/"]
    else:
        # Lazy: the thought ends at the first close.
        lines = ["thought_close[lazy]: /(?s:.*)<\\/think>/"]
    if thinking.opened:
        head = ["start: thought_close WS? @answer"]
    else:
        opening = f"<[{o}]>" if o is not None else '"<think>"'
        head = ["start: (thought WS?)? @answer", f"thought: {opening} thought_close"]
    return "\n".join([*head, *lines, _GAP]) + "\n"


def after_thinking(grammar: GrammarSpec | None, thinking: Thinking | None,
                   backend: Backend) -> GrammarSpec | None:
    """`grammar` held to the answer after the thinking (None stays None: nothing to hold)."""
    if grammar is None or thinking is None:
        return grammar
    table = backend.token_table()
    wanted = {OPEN.encode(), CLOSE.encode()}
    control = {table.pieces[t].decode(): t for t in table.control if table.pieces[t] in wanted}
    return replace(grammar, lead=thinking_lead(thinking, control))


def content_only(make: Callable[[], Callable[[str], bool]],
                 thinking: Thinking) -> Callable[[], Callable[[str], bool]]:
    """A rule read on the answer's text as it is committed (GenerationConfig.until), read on the
    answer after the thinking only."""
    def made() -> Callable[[str], bool]:
        reader, rule = ThoughtReader(thinking), make()

        def until(text: str) -> bool:
            answer = "".join(p.text for p in reader.push(text) if isinstance(p, Content))
            return rule(answer) if answer else False
        return until
    return made
