"""A session: one backend plus the token ids its KV cache holds. The single owner of positions.

Every decode goes through `extend` (append at the end) and every rollback through `rollback`,
so `len(self.tokens)` is always the number of positions in the cache: a decode that fails or is
interrupted (Ctrl-C) leaves the cache as it was before it. `extend` also splits a batch longer
than the backend's `n_batch` into decodes it can take.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from engine.backend import F32, Backend
from engine.errors import SettingsError


class Session:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.tokens: list[int] = []
        # A session owns its backend's cache: start from an empty one so positions agree.
        backend.truncate(0)

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], rows: Sequence[int] | None = None,
               pad_to: int = 0) -> F32:
        """Decode `tokens` after the cached ones; logits for `rows` (default: the last token).
        With `pad_to` above their number, the batch is padded to that width with copies of the
        last token, which leave the cache right after (engine/widths.py says why)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("extend needs at least one token")
        if self.n_past + len(tokens) > self.backend.n_ctx:
            raise SettingsError(
                f"context is full: {self.n_past + len(tokens)} tokens > n_ctx {self.backend.n_ctx}; "
                "raise --ctx or shorten the prompt/max tokens")
        rows = [len(tokens) - 1] if rows is None else list(rows)
        if any(not 0 <= r < len(tokens) for r in rows):
            raise ValueError(f"rows {rows} are outside a batch of {len(tokens)}")
        pad = max(0, min(pad_to, self.backend.n_ctx - self.n_past) - len(tokens))
        try:
            logits = self._decode(tokens + [tokens[-1]] * pad, rows)
            if pad:
                self.backend.truncate(self.n_past + len(tokens))
        except BaseException:
            # Whatever part of the batch reached the cache leaves it again.
            self.backend.truncate(self.n_past)
            raise
        self.tokens.extend(tokens)
        return logits

    def _decode(self, batch: list[int], rows: list[int]) -> F32:
        """Decode `batch` after the cached tokens in pieces of at most the backend's n_batch."""
        step = self.backend.n_batch or len(batch)
        if len(batch) <= step:
            return self.backend.decode(batch, self.n_past, rows)
        out: F32 | None = None
        for start in range(0, len(batch), step):
            piece = batch[start:start + step]
            mine = [i for i, r in enumerate(rows) if start <= r < start + len(piece)]
            got = self.backend.decode(piece, self.n_past + start, [rows[i] - start for i in mine])
            if out is None:
                out = np.empty((len(rows), self.backend.n_vocab), dtype=np.float32)
            for k, i in enumerate(mine):
                out[i] = got[k]
        # The batch is not empty, so the loop ran at least once.
        assert out is not None
        return out

    def rollback(self, n: int) -> None:
        """Keep the first `n` cached positions, drop the rest."""
        if n < len(self.tokens):
            self.backend.truncate(n)
            del self.tokens[n:]

    def common_prefix(self, tokens: Sequence[int]) -> int:
        # Asked every round: the usual answer (the cache is a prefix of the text, or the text
        # of the cache) is checked by one comparison in C before walking token by token.
        n = min(len(self.tokens), len(tokens))
        if list(self.tokens[:n]) == list(tokens[:n]):
            return n
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return n

    def sync(self, tokens: Sequence[int], feed_last: bool,
             widths: Callable[[int], int] | None = None) -> F32 | None:
        """Make the cache hold `tokens` (or all but the last one when not `feed_last`), reusing
        the longest common prefix already cached. Returns the last row of logits when anything
        was decoded, else None. `widths` maps the number of tokens to feed to the batch width
        to decode them at (padding)."""
        want = len(tokens) if feed_last else len(tokens) - 1
        keep = min(self.common_prefix(tokens), want)
        if feed_last and keep == want and want > 0:
            # Logits are not stored per position: re-decode the last token to get them.
            keep -= 1
        self.rollback(keep)
        if keep >= want:
            return None
        feed = tokens[keep:want]
        return self.extend(feed, pad_to=widths(len(feed)) if widths is not None else 0)
