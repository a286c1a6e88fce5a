"""One `tandem adapt` run, in its order: the prompts (the user's history or a prompts file) and
the held-out ones, the target's teacher answers, the memory plan, training into the store, the
proof on held-out prompts, and the decision the pairing record keeps.

Every fourth of the user's prompts is held out (category "yours"); the held-out suite adds a few
prompts of each of its categories, the "other prompts" the adapted draft must not lose on.

The gate (`decide`) keeps the base draft unless, on your held-out prompts, the adapted draft
raises tokens per target call at greedy and at T 0.7 with a 95% bootstrap interval (prompts
resampled, paired, BOOTSTRAP times) above zero, over at least MIN_YOURS prompts; no other
category loses more than MAX_LOSS acceptance per position; and the tokens/s measured on this
machine with the served file is not below the base's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from bench.adapt import proof
from bench.benchmark.gpu_profile import measured
from bench.adapt.data import Example
from engine.backend import Backend

HOLD_OUT_EVERY = 4
YOURS = "yours"
MAX_LOSS = 0.02
HELD_OUT_TOKENS = 48
SEED = 0
# Held-out prompts of yours the gate needs (each answered greedy and at T 0.7): with fewer, the
# interval over prompts is too wide to tell a gain of 10% from none.
MIN_YOURS = 8
BOOTSTRAP = 2000


def split(examples: Sequence[Example], n_prompts: int) -> tuple[list[Example], list[Example]]:
    """(trained, held out): the examples of every HOLD_OUT_EVERY-th prompt are held out, as
    category "yours". `examples` holds each prompt's answers in prompt order."""
    per = len(examples) // max(n_prompts, 1)
    trained, held = [], []
    for i, e in enumerate(examples):
        if (i // per) % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1:
            held.append(Example(YOURS, e.prompt, e.answer, e.temperature, e.argmax))
        else:
            trained.append(e)
    return trained, held


def split_prompts(prompts: Sequence[tuple[str, list[int]]]
                  ) -> tuple[list[tuple[str, list[int]]], list[tuple[str, list[int]]]]:
    """(trained, held out) prompts: every HOLD_OUT_EVERY-th is held out, as category "yours"."""
    trained, held = [], []
    for i, (cat, toks) in enumerate(prompts):
        if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1:
            held.append((YOURS, toks))
        else:
            trained.append((cat, toks))
    return trained, held


def interval(base: Sequence[proof.Rounds], adapted: Sequence[proof.Rounds],
             seed: int = SEED) -> tuple[float, float]:
    """The 95% bootstrap interval of the relative gain in tokens per target call (pooled), the
    prompts resampled with the two drafts paired."""
    if not base:
        return float("nan"), float("nan")
    acc_b = np.array([r.accepted.sum() for r in base])
    acc_a = np.array([r.accepted.sum() for r in adapted])
    n = np.array([r.rounds for r in base], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(base), (BOOTSTRAP, len(base)))
    calls = np.maximum(n[idx].sum(axis=1), 1.0)
    gain = (1 + acc_a[idx].sum(axis=1) / calls) / (1 + acc_b[idx].sum(axis=1) / calls) - 1
    lo, hi = np.percentile(gain, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Row:
    """One line of the proof's table: a held-out category at one temperature, pooled over its
    `prompts`, with the bootstrap interval of the gain in tokens per target call."""
    category: str
    temperature: float
    base: proof.Rounds
    adapted: proof.Rounds
    low: float = float("nan")
    high: float = float("nan")
    prompts: int = 0

    @property
    def gain(self) -> float:
        """Acceptance per position, adapted less base."""
        return self.adapted.mean_acceptance - self.base.mean_acceptance

    @property
    def call_gain(self) -> float:
        """Tokens per target call, adapted over base, less one."""
        return self.adapted.tokens_per_call / self.base.tokens_per_call - 1


def rows(results: proof.Measured, categories: Sequence[str]) -> list[Row]:
    out = []
    for temp in proof.TEMPERATURES:
        for cat in categories:
            base = results.get(("base", cat, temp), [])
            adapted = results.get(("adapted", cat, temp), [])
            lo, hi = interval(base, adapted)
            out.append(Row(cat, temp, proof.total(base), proof.total(adapted), lo, hi,
                           len(base)))
    return out


def _gain_text(r: Row) -> str:
    return (f"{r.call_gain:+.1%} tokens per target call at T {r.temperature:.1f} on your "
            f"{r.prompts} held-out prompts (95% interval {r.low:+.1%} to {r.high:+.1%})")


def decide(table: Sequence[Row], cpu: Mapping[tuple[str, float], float]) -> tuple[bool, str]:
    """Whether the adapted draft wins, and the reason line; `cpu`: measured tokens/s of the
    served files by (draft name, temperature)."""
    yours = [r for r in table if r.category == YOURS and r.base.rounds]
    if len(yours) < len(proof.TEMPERATURES) or min(r.prompts for r in yours) < MIN_YOURS:
        n = min((r.prompts for r in yours), default=0)
        return False, (f"kept the base draft: {n} held-out prompts of yours; the interval "
                       f"needs at least {MIN_YOURS} ({MIN_YOURS * HOLD_OUT_EVERY} prompts given)")
    for r in yours:
        if not r.low > 0:
            return False, f"kept the base draft: {_gain_text(r)} does not exclude zero"
    others = [r for r in table if r.category != YOURS and r.base.rounds]
    worst = min(others, key=lambda r: r.gain, default=None)
    if worst is not None and worst.gain < -MAX_LOSS:
        return False, (f"kept the base draft: {worst.gain:+.3f} acceptance per position on "
                       f"{worst.category} at T {worst.temperature:.1f} (more than {MAX_LOSS} "
                       "lost)")
    for temp in proof.TEMPERATURES:
        b, a = cpu.get(("base", temp)), cpu.get(("adapted", temp))
        if b is None or a is None or a < b:
            return False, (f"kept the base draft: measured {a or 0:.2f} tokens/s at T {temp:.1f} "
                           f"with the served file, {b or 0:.2f} with the base")
    other = (f"; {worst.gain:+.3f} at worst on other prompts ({worst.category})"
             if worst else "")
    return True, "adapted draft is the default: " + "; ".join(map(_gain_text, yours)) + other


def table_lines(table: Sequence[Row], cpu: dict[tuple[str, float], float]) -> list[str]:
    """The proof as one table: acceptance per draft position (base -> adapted), the mean, tokens
    per target call, the measured GPU profile's predicted speedup (its label below the table)
    and this CPU's measured tokens/s."""
    head = (f"{'held out':<16}{'T':>4}  {'acceptance per position 1..4 (base / adapted)':<46}"
            f"{'mean':>13}{'tok/call':>13}{'95% interval':>18}{'n':>4}{'GPU pred':>13}")
    lines = [head]
    for r in table:
        pos = " ".join(f"{b:.2f}/{a:.2f}" for b, a in zip(r.base.per_position,
                                                           r.adapted.per_position))
        lines.append(f"{r.category:<16}{r.temperature:>4.1f}  {pos:<46}"
                     f"{r.base.mean_acceptance:>6.3f}>{r.adapted.mean_acceptance:<6.3f}"
                     f"{r.base.tokens_per_call:>6.2f}>{r.adapted.tokens_per_call:<6.2f}"
                     f"{r.low:>+9.1%} {r.high:<+8.1%}{r.prompts:>4}"
                     f"{r.base.gpu_speedup():>5.2f}x>{r.adapted.gpu_speedup():<5.2f}x")
    lines.append(f"95% interval: of the gain in tokens per target call, {BOOTSTRAP} bootstrap "
                 f"resamples of the prompts; GPU pred: gamma {proof.GAMMA} on "
                 f"{measured().description}")
    for temp in proof.TEMPERATURES:
        if ("base", temp) in cpu:
            lines.append(f"measured on this CPU at T {temp:.1f} (gamma {proof.GAMMA}): "
                         f"{cpu['base', temp]:.2f} tokens/s base, "
                         f"{cpu['adapted', temp]:.2f} adapted")
    return lines


def cpu_speed(target: Backend, drafts: Mapping[str, Backend], prompts: Sequence[Example],
              generate: Callable[[Backend, Backend, Sequence[int], float], tuple[int, float]]
              ) -> dict[tuple[str, float], float]:
    """Tokens/s of speculative decoding with each draft on `prompts`, greedy and T 0.7:
    `generate(target, draft, prompt tokens, temperature)` -> (tokens, seconds)."""
    tokens: dict[tuple[str, float], float] = {}
    seconds: dict[tuple[str, float], float] = {}
    for temp in proof.TEMPERATURES:
        for e in prompts:
            # Interleaved prompt by prompt, so that the machine's drift favours neither.
            for name, d in drafts.items():
                k, secs = generate(target, d, e.prompt, temp)
                tokens[name, temp] = tokens.get((name, temp), 0.0) + k
                seconds[name, temp] = seconds.get((name, temp), 0.0) + secs
    return {key: tokens[key] / s if s else 0.0 for key, s in seconds.items()}


def losses_line(losses: Sequence[float], epochs: int) -> str:
    per = np.array_split(np.asarray(losses), max(epochs, 1))
    return "loss by epoch: " + ", ".join(f"{float(x.mean()):.3f}" for x in per if len(x))

