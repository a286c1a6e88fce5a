"""Byte-level fake backends for grammar tests: token i is byte i (0..255) and token 256 the
end-of-generation control token, so `tokenize` spells any text with the vocabulary's own tokens,
as llguidance needs to force canonical tokenizations (bench/fakes/backend.py's FakeBackend does not).

`ChatByteFake` adds the tool-call tags <tool_call> and </tool_call> as control tokens written
as their text (as llama.cpp writes Qwen's), and a chat template that reads `tools` the way
Qwen2.5's does, so the API hands them over natively."""
from __future__ import annotations

import json
import re
from typing import Sequence

from engine.backend import TokenTable
from bench.fakes.backend import FakeBackend

EOG = 256
TAGS = ("<tool_call>", "</tool_call>")
_TAG = re.compile("(" + "|".join(re.escape(t) for t in TAGS) + ")")


class ByteFake(FakeBackend):
    def __init__(self, seed: int = 0, noise: float = 0.0, n_ctx: int = 4096) -> None:
        super().__init__(n_vocab=EOG + 1, seed=seed, noise=noise, n_ctx=n_ctx, eog=EOG)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == EOG else bytes([token])


class AsciiFake(ByteFake):
    """Byte tokens whose rows allow printable ASCII only, so an answer's text tokenizes back to
    its tokens (a prediction made of an answer's text is the answer's tokens)."""

    def _row(self, context: Sequence[int]):
        row = super()._row(context).copy()
        row[:32] = row[127:EOG] = -30.0
        return row


class ChatByteFake(FakeBackend):
    # The tags the vocabulary has as control tokens, after the end (a subclass may add more).
    TAGS: tuple[str, ...] = TAGS

    def __init__(self, seed: int = 0, noise: float = 0.0, n_ctx: int = 2048) -> None:
        super().__init__(n_vocab=EOG + 1 + len(self.TAGS), seed=seed, noise=noise, n_ctx=n_ctx,
                         eog=EOG)
        self.name = f"bytes-{seed}-{noise}"
        self._tag = _TAG if self.TAGS == TAGS else re.compile(
            "(" + "|".join(re.escape(t) for t in self.TAGS) + ")")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out: list[int] = []
        for part in self._tag.split(text) if parse_special else [text]:
            if parse_special and part in self.TAGS:
                out.append(EOG + 1 + self.TAGS.index(part))
            else:
                out.extend(part.encode("utf-8"))
        return out

    def token_bytes(self, token: int) -> bytes:
        # As llama.cpp writes user-defined tags (<tool_call>) as text, and the end as nothing.
        return (bytes([token]) if token < EOG else b"" if token == EOG
                else self.TAGS[token - EOG - 1].encode())

    def token_table(self) -> TokenTable:
        pieces = (*(bytes([t]) for t in range(EOG)), b"<eog>", *(t.encode() for t in self.TAGS))
        return TokenTable(tuple(pieces), frozenset(range(EOG, self.n_vocab)), EOG)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        text = "".join(json.dumps(t) + "\n" for t in tools or ())
        for m in messages:
            text += f"[{m['role']}]{m.get('content') or ''}"
            for call in m.get("tool_calls") or ():
                f = call["function"]
                text += TAGS[0] + json.dumps({"name": f["name"], "arguments": f["arguments"]}) + TAGS[1]
            text += "\n"
        return text + "[assistant]"
