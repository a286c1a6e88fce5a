"""A tiny-vocabulary fake whose rows are a table lookup (`TableFake`), and the virtual clock its
decodes advance (`VirtualClock`): fast enough to enumerate a generation's every random choice
(tests/exact_law.py), and deterministic where wall time is not."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bench.fakes.backend import FakeBackend
from engine.backend import Part


class VirtualClock:
    """Milliseconds that pass only when a costed fake decodes: a deterministic stand-in for
    wall time, and a cost profile (TableFake's `cost`) when the costs are chosen to match one."""

    def __init__(self) -> None:
        self.ms = 0.0

    def now(self) -> float:
        return self.ms

    def charge(self, cost: Sequence[float], width: int) -> None:
        """A decode of `width` tokens at `cost` (virtual ms of a decode of 1, 2, ... tokens); past
        the table a batch costs its widest entry's per-token share (a prefill)."""
        self.ms += cost[width - 1] if width <= len(cost) else cost[-1] * width / len(cost)


class TableFake(FakeBackend):
    """A tiny-vocabulary fake whose logits are a table lookup on the last two tokens (fast to
    run thousands of times), optionally rounded to a grid so rows hold exact ties, with token
    `eog` ending the generation and each decode of w tokens costing `cost[w - 1]` virtual ms.
    `keep_ids` leaves only those tokens finite (a draft with a trimmed output vocabulary)."""

    def __init__(self, n_vocab: int = 8, seed: int = 0, scale: float = 2.5, noise: float = 0.0,
                 grid: float = 0.0, eog: int | None = None, clock: VirtualClock | None = None,
                 cost: Sequence[float] = (1.0,), keep_ids: Sequence[int] | None = None) -> None:
        super().__init__(n_vocab=n_vocab, seed=seed, scale=scale, eog=eog, order=2)
        rng = np.random.default_rng(seed)
        table = rng.standard_normal((n_vocab, n_vocab, n_vocab)) * scale
        if noise:
            table = table + np.random.default_rng(seed + 1000).standard_normal(table.shape) * noise
        if grid:
            table = np.round(table / grid) * grid
        if eog is not None:
            table[..., eog] -= 1.5
        if keep_ids is not None:
            mask = np.full(n_vocab, -np.inf)
            mask[list(keep_ids)] = 0.0
            table = table + mask
        self.table = table.astype(np.float32)
        self.clock = clock
        self.cost = list(cost)

    def _row(self, context: Sequence[int]) -> np.ndarray:
        a = context[-2] if len(context) > 1 else 0
        return self.table[a, context[-1]]

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int],
               seq: int = 0) -> np.ndarray:
        return self.decode_batch([Part(seq, tokens, pos, rows)])[0]

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        # One model call, charged at the batch's whole width.
        if self.clock is not None:
            self.clock.charge(self.cost, sum(len(p.tokens) for p in parts))
        return super().decode_batch(parts)
