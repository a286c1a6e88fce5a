"""scripts/policy_sim.py's replay on synthetic traces: its round arithmetic against hand counts."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from engine.controller import AdaptiveController
from engine.policy import FixedGamma

_spec = importlib.util.spec_from_file_location(
    "policy_sim", Path(__file__).resolve().parents[1] / "scripts" / "policy_sim.py")
policy_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(policy_sim)

# Verify 100 ms for one token, +20 ms per extra row; a draft decode 10 ms at any width.
COSTS = policy_sim.Costs([100.0 + 20.0 * i for i in range(9)], {"1": 10.0, "64": 10.0})


def trace(n: int, wrong_at: set[int], conf: float = 0.99) -> dict:
    gen = list(range(10, 10 + n))
    return {"gen": gen, "dargmax": [(-1 if i in wrong_at else t) for i, t in enumerate(gen)] + [0],
            "dconf": [conf] * (n + 1), "tconf": [0.99] * (n + 1)}


def test_plain_decoding_replays_at_exactly_one():
    assert policy_sim.replay_one(trace(12, set()), FixedGamma(0), COSTS, 0.0) == pytest.approx(1.0)


def test_a_draft_that_is_always_right_replays_by_hand_count():
    # 11 tokens then EOS, gamma 3: rounds commit 4, 4, then 3 tokens + EOS (gamma cut to room).
    # Each round: draft 3 x 10 ms (2 x 10 for the last, which has 2 of room), verify 160 / 140 ms.
    speed = policy_sim.replay_one(trace(11, set()), FixedGamma(3), COSTS, 0.0)
    plain = 100.0 * 12
    rounds = (30 + 160) + (30 + 160) + (30 + 160)
    assert speed == pytest.approx(plain / rounds)


def test_the_chain_stop_and_the_trim_cut_doubtful_drafts():
    doubtful = trace(12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, conf=0.2)
    full = policy_sim.replay_one(doubtful, FixedGamma(3), COSTS, 0.0)
    stopped = policy_sim.replay_one(doubtful, FixedGamma(3), COSTS, 0.5)
    assert stopped > full
    c = AdaptiveController(max_gamma=3, verify_ms=COSTS.verify_ms, draft_ms=[10.0] * 9,
                           model_source="draft-model")
    # Nothing the draft doubts is verified: the adaptive run costs at most its draft decodes.
    assert policy_sim.replay_one(doubtful, c, COSTS, 0.5) > stopped
