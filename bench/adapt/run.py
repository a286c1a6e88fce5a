"""One `tandem adapt` run, in its order: the prompts (the user's history or a prompts file) and
the held-out ones, the target's teacher answers, the memory plan, training into the store, the
proof on held-out prompts, and the decision the pairing record keeps.

Every fourth of the user's prompts is held out (category "yours"); the held-out suite adds a few
prompts of each of its categories, the "other prompts" the adapted draft must not lose on. The
adapted draft wins when its greedy acceptance per position on the held-out prompts of the user's
kind is higher and no other category loses more than `MAX_LOSS`.
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


def split(examples: Sequence[Example], n_prompts: int) -> tuple[list[Example], list[Example]]:
    """(trained, held out): the examples of every HOLD_OUT_EVERY-th prompt are held out, as
    category "yours". `examples` holds each prompt's answers in prompt order."""
    per = len(examples) // max(n_prompts, 1)
    trained, held = [], []
    for i, e in enumerate(examples):
        if (i // per) % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1:
            held.append(Example(YOURS, e.prompt, e.answer, e.temperature))
        else:
            trained.append(e)
    return trained, held


@dataclass(frozen=True)
class Row:
    """One line of the proof's table: a held-out category at one temperature."""
    category: str
    temperature: float
    base: proof.Rounds
    adapted: proof.Rounds

    @property
    def gain(self) -> float:
        return self.adapted.mean_acceptance - self.base.mean_acceptance


def rows(results: dict, categories: Sequence[str]) -> list[Row]:
    out = []
    for temp in proof.TEMPERATURES:
        for cat in categories:
            out.append(Row(cat, temp, proof.pooled(results, "base", [cat], temp),
                           proof.pooled(results, "adapted", [cat], temp)))
    return out


def decide(table: Sequence[Row]) -> tuple[bool, str]:
    """Whether the adapted draft wins, and the reason line."""
    greedy = [r for r in table if r.temperature == 0]
    yours = next((r for r in greedy if r.category == YOURS), None)
    if yours is None or not yours.base.rounds:
        return False, "kept the base draft: no held-out prompt of yours to prove it on"
    worst = min((r for r in greedy if r.category != YOURS and r.base.rounds),
                key=lambda r: r.gain, default=None)
    if yours.gain <= 0:
        return False, (f"kept the base draft: on your held-out prompts it accepts "
                       f"{yours.gain:+.3f} per position at greedy")
    if worst is not None and worst.gain < -MAX_LOSS:
        return False, (f"kept the base draft: {yours.gain:+.3f} per position on your prompts, "
                       f"but {worst.gain:+.3f} on {worst.category} (more than {MAX_LOSS} lost)")
    other = f", {worst.gain:+.3f} at worst on other prompts ({worst.category})" if worst else ""
    return True, (f"adapted draft is the default: {yours.gain:+.3f} acceptance per position "
                  f"at greedy on your held-out prompts{other}")


def table_lines(table: Sequence[Row], cpu: dict[tuple[str, float], float]) -> list[str]:
    """The proof as one table: acceptance per draft position (base -> adapted), the mean, tokens
    per target call, the measured GPU profile's predicted speedup (its label below the table)
    and this CPU's measured tokens/s."""
    head = (f"{'held out':<16}{'T':>4}  {'acceptance per position 1..4 (base / adapted)':<46}"
            f"{'mean':>13}{'tok/call':>13}{'GPU pred':>13}")
    lines = [head]
    for r in table:
        pos = " ".join(f"{b:.2f}/{a:.2f}" for b, a in zip(r.base.per_position,
                                                           r.adapted.per_position))
        lines.append(f"{r.category:<16}{r.temperature:>4.1f}  {pos:<46}"
                     f"{r.base.mean_acceptance:>6.3f}>{r.adapted.mean_acceptance:<6.3f}"
                     f"{r.base.tokens_per_call:>6.2f}>{r.adapted.tokens_per_call:<6.2f}"
                     f"{r.base.gpu_speedup():>5.2f}x>{r.adapted.gpu_speedup():<5.2f}x")
    lines.append(f"GPU pred: gamma {proof.GAMMA} on {measured().description}")
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
    out = {}
    for temp in proof.TEMPERATURES:
        for name, d in drafts.items():
            n = s = 0.0
            for e in prompts:
                k, secs = generate(target, d, e.prompt, temp)
                n, s = n + k, s + secs
            out[name, temp] = n / s if s else 0.0
    return out


def losses_line(losses: Sequence[float], epochs: int) -> str:
    per = np.array_split(np.asarray(losses), max(epochs, 1))
    return "loss by epoch: " + ", ".join(f"{float(x.mean()):.3f}" for x in per if len(x))

