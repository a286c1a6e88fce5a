"""A scripted backend with deterministic logits, for testing the engine without any model.

Logits at each position are a pure function of the last few tokens (a seeded hash), so two
fakes built with the same seed are the same "model", and a fake with `noise` > 0 is a nearby
draft model. `decode` enforces llama.cpp's rules: a batch starts right after the cache, fits
the context and holds at most `n_batch` tokens (llama.cpp aborts the process on the last two,
so here they are AssertionErrors, which no test may see). It holds `n_seq` sequences, each its
own cache; `decode_batch` decodes several in one call, recorded in `batches`.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from engine.backend import Part, TokenTable
from engine.drafters.base import Drafter, Proposal


class FakeBackend:
    def __init__(self, n_vocab: int = 64, seed: int = 0, noise: float = 0.0, scale: float = 3.0,
                 n_ctx: int = 4096, eog: int | None = None, order: int = 2,
                 n_batch: int = 512, n_seq: int = 8) -> None:
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.name = f"fake-{seed}-{noise}"
        self.seed, self.noise, self.scale, self.eog, self.order = seed, noise, scale, eog, order
        self.n_seq = n_seq
        # Each sequence's cache; `cache` is sequence 0's.
        self.caches: list[list[int]] = [[] for _ in range(n_seq)]
        self.cache = self.caches[0]
        self.calls: list[tuple[int, int]] = []
        # Each batched decode as (sequence, tokens) per part.
        self.batches: list[tuple[tuple[int, int], ...]] = []

    def _row(self, context: Sequence[int]) -> np.ndarray:
        key = f"{self.seed}|{list(context[-self.order:])}".encode()
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        row = rng.standard_normal(self.n_vocab) * self.scale
        if self.noise:
            nkey = f"noise|{self.noise}|{list(context[-self.order:])}".encode()
            nrng = np.random.default_rng(int.from_bytes(hashlib.sha256(nkey).digest()[:8], "little"))
            row = row + nrng.standard_normal(self.n_vocab) * self.noise
        if self.eog is not None:
            row[self.eog] = -30.0
        return row.astype(np.float32)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [1 + (b % (self.n_vocab - 1)) for b in text.encode("utf-8")]

    def token_bytes(self, token: int) -> bytes:
        if token == self.eog:
            return b""
        # Tokens 60..63 are halves of two-byte characters (é = C3 A9, ü = C3 BC).
        halves = {60: b"\xc3", 61: b"\xa9", 62: b"\xc3", 63: b"\xbc"}
        if token in halves:
            return halves[token]
        return bytes([97 + token % 26])

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    def token_table(self) -> TokenTable:
        # The end-of-generation token is a control token written as text, as in real vocabularies.
        pieces = tuple(b"<eog>" if t == self.eog else self.token_bytes(t)
                       for t in range(self.n_vocab))
        control = frozenset() if self.eog is None else frozenset({self.eog})
        return TokenTable(pieces, control, -1 if self.eog is None else self.eog)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        # A template that does not read `tools` (the API then describes them in a system message).
        return "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages) + "<assistant>"

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int],
               seq: int = 0) -> np.ndarray:
        return self._decode(Part(seq, tokens, pos, rows))

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        if len({p.seq for p in parts}) != len(parts):
            raise AssertionError(f"a batch holds sequences {[p.seq for p in parts]}")
        self.batches.append(tuple((p.seq, len(p.tokens)) for p in parts))
        return [self._decode(p) for p in parts]

    def _decode(self, part: Part) -> np.ndarray:
        tokens, pos, rows = part.tokens, part.pos, part.rows
        cache = self.caches[part.seq]
        if pos != len(cache):
            raise AssertionError(f"inconsistent positions: batch at {pos}, cache holds {len(cache)}")
        if not 0 < len(tokens) <= self.n_batch:
            raise AssertionError(f"GGML_ASSERT: a batch of {len(tokens)} tokens, n_batch {self.n_batch}")
        if pos + len(tokens) > self.n_ctx:
            raise AssertionError(f"positions {pos}..{pos + len(tokens) - 1} past n_ctx {self.n_ctx}")
        self.calls.append((pos, len(tokens)))
        cache.extend(int(t) for t in tokens)
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.stack([self._row(cache[:pos + r + 1]) for r in rows])

    def truncate(self, n: int, seq: int = 0) -> None:
        del self.caches[seq][n:]

    def close(self) -> None:
        for cache in self.caches:
            cache.clear()


class ScriptedDrafter(Drafter):
    """Proposes the target's greedy continuation, corrupted at a scripted position each round:
    `pattern[r % len(pattern)]` is the first wrong position of round r (>= gamma: none wrong)."""

    def __init__(self, target_like: FakeBackend, pattern: Sequence[int]) -> None:
        self.name = "scripted"
        self.model = target_like
        self.pattern = list(pattern)
        self.round = 0

    def propose(self, plan, gamma, params, rng, keep=None):
        context = plan.context
        wrong_at = self.pattern[self.round % len(self.pattern)]
        self.round += 1
        ctx = list(context)
        out = []
        for i in range(gamma):
            best = int(np.argmax(self.model._row(ctx)))
            tok = (best + 1) % self.model.n_vocab if i == wrong_at else best
            out.append(tok)
            ctx.append(tok)
        return Proposal(tokens=np.asarray(out, dtype=np.int32), q=None, source=self.name)
