"""A fake backend whose tokens spell text byte by byte, for grammar tests: token b < 256 is the
byte b, then three control tokens (end of turn, <tool_call>, </tool_call>) written as their
text. Its `tokenize` spells text with exactly these tokens, as llguidance expects of a
tokenizer (tests/fakes.py's FakeBackend maps bytes onto 64 tokens and is not consistent). Its
chat template reads `tools` the way Qwen2.5's does, so the API hands them over natively."""
from __future__ import annotations

import json
import re
from typing import Sequence

from engine.backend import TokenTable
from tests.fakes import FakeBackend

CONTROL = ("<|end|>", "<tool_call>", "</tool_call>")
EOS = 256
_SPECIAL = re.compile("(" + "|".join(re.escape(c) for c in CONTROL) + ")")


class ByteBackend(FakeBackend):
    def __init__(self, seed: int = 0, noise: float = 0.0, n_ctx: int = 2048) -> None:
        super().__init__(n_vocab=256 + len(CONTROL), seed=seed, noise=noise, n_ctx=n_ctx,
                         eog=EOS)
        self.name = f"bytes-{seed}-{noise}"

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        parts = _SPECIAL.split(text) if parse_special else [text]
        out: list[int] = []
        for part in parts:
            if parse_special and part in CONTROL:
                out.append(256 + CONTROL.index(part))
            else:
                out.extend(part.encode("utf-8"))
        return out

    def token_bytes(self, token: int) -> bytes:
        # As llama.cpp writes user-defined tags (<tool_call>) as text, and the end token as nothing.
        return bytes([token]) if token < 256 else b"" if token == EOS else CONTROL[token - 256].encode()

    def token_table(self) -> TokenTable:
        pieces = tuple(bytes([t]) for t in range(256)) + tuple(c.encode() for c in CONTROL)
        return TokenTable(pieces, frozenset(range(256, 256 + len(CONTROL))), EOS)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        text = "".join(json.dumps(t) + "\n" for t in tools or ())
        for m in messages:
            text += f"[{m['role']}]{m.get('content') or ''}"
            for call in m.get("tool_calls") or ():
                f = call["function"]
                text += "<tool_call>" + json.dumps({"name": f["name"], "arguments": f["arguments"]}) + "</tool_call>"
            text += "<|end|>"
        return text + "[assistant]"
