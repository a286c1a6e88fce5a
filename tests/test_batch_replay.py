"""The controller's decisions by batch width on a synthetic flat curve and the CPU cost profile
(bench/research/batch_replay.py, issue 46): they change with the batch on both, and where the
batch settles, on every profile the replay prints (the measured GPU's among them), is at least as
fast as plain batched decoding and as every sequence drafting what it would alone (on the
measured GPU profile four sequences drafting 1 each through the draft model settled 1.2% under
plain batched before a gamma in a batch had to beat the batch decoding plainly, issue 62)."""
from __future__ import annotations

import pytest

from bench.fakes.costed import CPU
from bench.research.batch_replay import BATCHES, PLANS, PROFILES, replay
from bench.ceiling import TYPICAL_ACCEPTANCE
from tests.fakes.flat_costs import FLAT


def rows(profile, name):
    return {r.sequences: r for r in replay(profile, PLANS[name], TYPICAL_ACCEPTANCE)}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_on_a_flat_curve_gamma_shrinks_as_the_batch_fills_and_drafting_goes_on(name: str) -> None:
    r = rows(FLAT, name)
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


@pytest.mark.parametrize("profile,name", [
    pytest.param(p, name, id=f"{p.name}-{name}") for p in (FLAT, *PROFILES)
    for name in sorted(PLANS)])
def test_where_the_batch_settles_is_no_slower_than_plain_or_drafting_as_alone(profile,
                                                                             name: str) -> None:
    for r in replay(profile, PLANS[name], TYPICAL_ACCEPTANCE):
        assert r.aggregate >= r.plain * (1 - 1e-9), r
        assert r.aggregate >= r.as_alone * (1 - 1e-9), r
        assert r.per_sequence == pytest.approx(r.aggregate / r.sequences)
        if r.reason.startswith(("batch of", "plain: batch of")):
            # The line names the step's width where the batch settled.
            assert f" at width {r.width}" in r.reason, r
