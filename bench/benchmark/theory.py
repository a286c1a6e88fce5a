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

GPU profile: on a GPU a verify of up to 9 tokens costs what one token does (v ~ 1 for widths
1-8) and the draft model about a tenth of a target token, so a run's rounds predict there

    speedup_gpu   = output tokens / (target calls + 0.1 x tokens the draft model drafted)

over plain decoding's one target call a token. It keeps the measured run's rounds (a controller
calibrated on the GPU would draft more) and leaves out the engine's own time per token (`tandem
bench --overhead` measures that).

Amdahl: when a fraction s of the baseline's end-to-end time is prefill (which speculation does
not shorten) and decoding gets faster by S, the end-to-end speedup is 1 / (s + (1 - s) / S).
"""
from __future__ import annotations

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


# The GPU profile's draft-model cost, in target tokens (the module docstring).
GPU_DRAFT_COST = 0.1


def gpu_profile_speedup(output_tokens: int, target_calls: int, draft_model_tokens: int) -> float:
    """A run's predicted speedup over plain decoding on the GPU profile (module docstring)."""
    cost = target_calls + GPU_DRAFT_COST * draft_model_tokens
    return output_tokens / cost if cost > 0 else float("nan")
