"""Batch widths worth padding to.

On CPU, ggml multiplies quantized weights by blocks of 4 rows, with a slower path for the rest,
so a batch of 3 tokens costs more than one of 4: measured here (2 threads, logits for 3 rows),
the 1.5B target 145 ms for 3 tokens and 123 ms for 4, the 0.5B draft 35 / 39 / 32 ms for 2 / 3 /
4 (`bench/research/measure_costs.py widths`, docs/BENCHMARKS.md). Decoding such a batch padded with
copies of its last token up to the cheaper width, then dropping the copies from the cache, is
faster and changes no real row: attention is causal, so a pad token after the real ones is never
seen by them. (Like any change of batch width, it can move logits by the batch kernels' rounding.)
"""
from __future__ import annotations

from typing import Sequence


def padded_width(costs: Sequence[float], w: int, saving: float = 0.03) -> int:
    """The width at which to decode a batch of `w` tokens, given `costs[v - 1]`, the measured ms
    of a batch of v: the cheapest width v >= w in the table when it saves at least `saving` of
    cost(w), else w (also past the table, where nothing was measured)."""
    if w < 1 or w > len(costs):
        return w
    best = w
    for v in range(w + 1, len(costs) + 1):
        if costs[v - 1] < costs[best - 1]:
            best = v
    return best if costs[best - 1] <= costs[w - 1] * (1.0 - saving) else w
