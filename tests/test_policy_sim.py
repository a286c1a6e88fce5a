"""bench/research/policy_sim.py's replay on synthetic traces: the real `Pair.generate` over fakes that
answer as a trace recorded, timed by the trace's costs on a virtual clock."""
from __future__ import annotations


import pytest

from engine.control.controller import AdaptiveController
from engine.control.policy import FixedGamma
from bench.benchmark.gpu_profile import measured
from bench.research import policy_sim


# Verify 100 ms for one token, +20 ms per extra row; a draft decode 10 ms at any width.
COSTS = policy_sim.Costs([100.0 + 20.0 * i for i in range(9)], {"1": 10.0, "64": 10.0})


def trace(n: int, wrong_at: set[int], conf: float = 0.99) -> dict:
    gen = list(range(10, 10 + n))
    return {"id": "t", "cat": "x", "toks": [1, 2, 3, 4], "gen": gen,
            "dargmax": [(5 if i in wrong_at else t) for i, t in enumerate(gen)] + [0],
            "dconf": [conf] * (n + 1), "tconf": [0.99] * (n + 1)}


def test_plain_decoding_replays_at_exactly_one():
    # Hybrid prefills its draft model only when it drafts; the draft drafter prefills at once.
    assert policy_sim.replay_one(trace(12, set()), lambda: FixedGamma(0), COSTS, 0.0,
                                 "hybrid") == pytest.approx(1.0)
    # 12 tokens and the end (13 x 100 ms), and the draft's prefill (10 ms); the target's
    # prefill is left out of both.
    assert policy_sim.replay_one(trace(12, set()), lambda: FixedGamma(0), COSTS,
                                 0.0) == pytest.approx(1300.0 / 1310.0)


def test_a_draft_that_is_always_right_replays_by_hand_count():
    # 11 tokens then EOS, gamma 3: rounds commit 4, 4 and 3 + the end, each a catch-up-free
    # draft of 3 (the first feeds the prompt's last token too) and a verify of 4 (160 ms);
    # the draft's prefill costs 10 ms (the target's is left out of both). Plain: 12 decodes of
    # 100 ms.
    speed = policy_sim.replay_one(trace(11, set()), lambda: FixedGamma(3), COSTS, 0.0)
    plain = 100.0 * 12
    spec = 10.0 + 3 * (30.0 + 160.0)
    assert speed == pytest.approx(plain / spec)


def test_the_chain_stop_and_the_trim_cut_doubtful_drafts():
    doubtful = trace(12, set(range(12)), conf=0.2)
    full = policy_sim.replay_one(doubtful, lambda: FixedGamma(3), COSTS, 0.0)
    stopped = policy_sim.replay_one(doubtful, lambda: FixedGamma(3), COSTS, 0.5)
    assert stopped > full
    # Nothing the draft doubts is verified: the adaptive run costs at most its draft decodes.
    adaptive = policy_sim.replay_one(doubtful, lambda: AdaptiveController(max_gamma=3), COSTS,
                                     0.5)
    assert adaptive > stopped


def test_the_oracle_bounds_every_policy():
    t = trace(30, {4, 11, 19})
    best = policy_sim.oracle_one(t, COSTS)
    for make in (lambda: FixedGamma(2), lambda: FixedGamma(4), lambda: None):
        assert policy_sim.replay_one(t, make, COSTS, 0.0) <= best * 1.05


def test_a_suite_replay_carries_the_evidence_from_answer_to_answer():
    # A copy of the prompt's text the answer repeats: lookup drafts it, and what the first
    # answer learns of lookup is where the second starts.
    t = trace(24, set())
    t["toks"] = [1, 2, 3, 4] + t["gen"]
    fresh = policy_sim.replay_one(t, lambda: None, COSTS, 0.5, "hybrid")
    runs = policy_sim.suite_speeds([t, dict(t, id="u")], COSTS, 2)
    # The first answer knows nothing, as a fresh pair's; later ones start from its evidence.
    assert runs["t"][0] == pytest.approx(fresh)
    assert runs["t"][1] != pytest.approx(fresh)
    assert len(runs["u"]) == 2


def test_the_gpu_costs_are_the_measured_profiles_own_milliseconds():
    profile = measured()
    gpu = policy_sim.gpu_costs(profile)
    # Measured widths as measured, past the widest as the profile extends them.
    assert [gpu.verify(w) for w in profile.widths] == pytest.approx(list(profile.verify_ms))
    assert gpu.verify(64) == pytest.approx(profile.verify(64))
    assert gpu.verify(64) > profile.verify_ms[-1]
    assert gpu.draft_batch(1) == pytest.approx(profile.draft_ms[0])
    assert gpu.draft_batch(48) == pytest.approx(profile.draft_decode(48))
