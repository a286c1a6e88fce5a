"""Closed forms the measurements are compared against.

Leviathan et al. (2023), with the verify cost measured instead of assumed constant. With
per-token acceptance rate a, gamma drafted tokens per round, c = (draft time per drafted token)
/ (target time per token in plain decoding) and v(gamma) = (time of one verify call on a
(gamma+1)-token batch) / (target time per token in plain decoding):

    E(a, gamma)   = (1 - a^(gamma+1)) / (1 - a)          expected tokens committed per round
                                                        (gamma + 1 when a = 1)
    speedup       = E(a, gamma) / (gamma * c + v(gamma))

The paper's form is the special case v = 1 (a batch costs as much as one token). The denominator
is the cost model's round cost in units of a plain token (`round_cost`, engine/control/costs.py),
the one formula the adaptive controller prices rounds with.

GPU profile: the measured one (bench/benchmark/gpu_profile.py: the H200 run's verify curve v(w)
and draft cost c, with its label). A run's rounds predict there

    speedup_gpu   = output tokens / (sum over target calls of v(width) + c x tokens the draft
                                     model drafted)

over plain decoding's one target call a token (v(1) = 1), each call's width read from the run's
drafted tokens per draft position (a round that drafted g tokens verifies g + 1; the other calls
one). It keeps the measured run's rounds (a controller calibrated on the GPU would draft
otherwise), leaves out the draft's catch-up decodes and the engine's own time per token (`tandem
bench --overhead` measures that).

Amdahl: when a fraction s of the baseline's end-to-end time is prefill (which speculation does
not shorten) and decoding gets faster by S, the end-to-end speedup is 1 / (s + (1 - s) / S).
"""
from __future__ import annotations

from typing import Sequence

from bench.benchmark.gpu_profile import GpuProfile, measured
from engine.control.costs import round_cost


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {alpha}")
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: float, cost_ratio: float, verify_ratio: float) -> float:
    """E(a, gamma) / (gamma * c + v(gamma)); see the module docstring."""
    denom = float(round_cost(verify_ratio, gamma, cost_ratio))
    if denom <= 0:
        raise ValueError("draft and verify costs must not both be zero")
    return expected_tokens_per_round(alpha, gamma) / denom


def amdahl_speedup(prefill_share: float, decode_speedup: float) -> float:
    if not 0.0 <= prefill_share <= 1.0:
        raise ValueError(f"prefill share must be in [0, 1], got {prefill_share}")
    if decode_speedup <= 0:
        raise ValueError(f"decode speedup must be > 0, got {decode_speedup}")
    return 1.0 / (prefill_share + (1.0 - prefill_share) / decode_speedup)


def call_widths(target_calls: int, drafted_at: Sequence[int]) -> dict[int, int]:
    """Target calls by width: `drafted_at[i]` rounds drafted a token at position i, so
    drafted_at[g - 1] - drafted_at[g] rounds drafted g and verified g + 1; the rest one token."""
    at = [int(n) for n in drafted_at] + [0]
    widths = {g + 1: at[g - 1] - at[g] for g in range(1, len(at)) if at[g - 1] > at[g]}
    plain = target_calls - (at[0] if drafted_at else 0)
    if plain < 0 or any(n < 0 for n in widths.values()):
        raise ValueError(f"{target_calls} target calls cannot hold rounds drafting {list(drafted_at)}")
    if plain:
        widths[1] = plain
    return widths


def gpu_profile_speedup(output_tokens: int, target_calls: int, drafted_at: Sequence[int],
                        draft_model_tokens: int, profile: GpuProfile | None = None) -> float:
    """A run's predicted speedup over plain decoding on the measured GPU profile (module
    docstring; `profile` None: the H200 run's)."""
    p = profile if profile is not None else measured()
    cost = sum(n * p.ratio(w) for w, n in call_widths(target_calls, drafted_at).items())
    cost += p.draft_cost * draft_model_tokens
    return output_tokens / cost if cost > 0 else float("nan")
