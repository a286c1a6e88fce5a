"""Backends that answer at once (the overhead runs, bench/overhead/): each decode returns rows of
a bank of precomputed logits and times itself, so the engine's own time is what is left."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from engine.backend import Part, TokenTable


class InstantBackend:
    """A `Backend` whose decode returns bank rows at once; `decode_s` totals its own time.
    With `shift`, the row at position p is rolled by p * 7919 + shift entries, so the text
    never repeats and backends of different shifts never agree."""

    def __init__(self, bank: np.ndarray, name: str, n_ctx: int = 8192,
                 shift: int | None = None) -> None:
        self.bank = bank
        self.shift = shift
        self.n_vocab = bank.shape[1]
        self.n_ctx = n_ctx
        self.n_batch = 512
        # One sequence: the overhead runs time one generation.
        self.n_seq = 1
        self.name = name
        self.cache: list[int] = []
        self.decode_s = 0.0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [1 + b for b in text.encode("utf-8")]

    def token_bytes(self, token: int) -> bytes:
        return bytes([97 + token % 26])

    def is_eog(self, token: int) -> bool:
        return False

    def token_table(self) -> TokenTable:
        return TokenTable(tuple(self.token_bytes(t) for t in range(self.n_vocab)), frozenset(), -1)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        return "".join(m["content"] for m in messages)

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        return [self.decode(p.tokens, p.pos, p.rows, p.seq) for p in parts]

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int],
               seq: int = 0) -> np.ndarray:
        t0 = time.thread_time()
        self.cache[pos:] = [int(t) for t in tokens]
        slots = [(self.cache[pos + r - 1] * 31 + self.cache[pos + r]) % len(self.bank)
                 if pos + r else 0 for r in rows]
        if self.shift is None:
            out = self.bank[slots]
        else:
            out = np.empty((len(slots), self.n_vocab), dtype=self.bank.dtype)
            for i, (slot, r) in enumerate(zip(slots, rows)):
                k = ((pos + r) * 7919 + self.shift) % self.n_vocab
                out[i, k:] = self.bank[slot, :self.n_vocab - k]
                out[i, :k] = self.bank[slot, self.n_vocab - k:]
        self.decode_s += time.thread_time() - t0
        return out

    def truncate(self, n: int, seq: int = 0) -> None:
        del self.cache[n:]

    def close(self) -> None:
        self.cache.clear()


class CopyRefusingBackend(InstantBackend):
    """An `InstantBackend` that never continues a pair of tokens as it was continued before:
    each row pushes the tokens that followed earlier occurrences of its context's last two
    tokens down into the bulk (`floor`), so a copy of what followed a match of two or more
    tokens is always wrong at its first token, in every sampling mode."""

    floor = -20.0

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int],
               seq: int = 0) -> np.ndarray:
        out = super().decode(tokens, pos, rows, seq)
        t0 = time.thread_time()
        text = np.asarray(self.cache, dtype=np.int64)
        for i, r in enumerate(rows):
            c = text[:pos + r + 1]
            if len(c) >= 3:
                out[i, c[2:][(c[:-2] == c[-2]) & (c[1:-1] == c[-1])]] = self.floor
        self.decode_s += time.thread_time() - t0
        return out
