"""The controller's decisions by batch width on the GPU and CPU cost profiles
(bench/research/batch_replay.py, issue 46): they change with the batch on both, and where the
batch settles is at least as fast as plain batched decoding and as every sequence drafting what
it would alone."""
from __future__ import annotations

import pytest

from bench.fakes.costed import CPU, GPU
from bench.research.batch_replay import BATCHES, PLANS, PROFILES, replay
from bench.ceiling import TYPICAL_ACCEPTANCE


def rows(profile, name):
    return {r.sequences: r for r in replay(profile, PLANS[name], TYPICAL_ACCEPTANCE)}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_on_the_gpu_gamma_shrinks_as_the_batch_fills_and_drafting_goes_on(name: str) -> None:
    r = rows(GPU, name)
    tops = [max(r[n].gammas) for n in BATCHES]
    assert all(a >= b for a, b in zip(tops, tops[1:])), tops
    assert tops[-1] < tops[0]
    assert min(r[8].gammas) > 0
    assert r[8].reason.startswith("batch of 8 at width ")


def test_on_the_cpu_lookup_drafts_alone_and_stops_once_the_batch_fills() -> None:
    r = rows(CPU, "lookup")
    assert r[1].gammas[0] > 0
    # Two sequences: one drafting pays, both do not.
    assert sorted(r[2].gammas) == [0, r[2].gammas[0]] and r[2].gammas[0] > 0
    for n in (4, 8):
        assert r[n].gammas == (0,) * n
        assert r[n].reason.startswith(f"plain: batch of {n}: drafting cannot pay at width ")


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
def test_where_the_batch_settles_is_no_slower_than_plain_or_drafting_as_alone(profile,
                                                                             name: str) -> None:
    for r in replay(profile, PLANS[name], TYPICAL_ACCEPTANCE):
        assert r.aggregate >= r.plain * (1 - 1e-9), r
        assert r.aggregate >= r.as_alone * (1 - 1e-9), r
        assert r.per_sequence == pytest.approx(r.aggregate / r.sequences)
