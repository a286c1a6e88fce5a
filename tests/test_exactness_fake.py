"""The exactness check on fake models: the exact rule passes every setting and the biased
negative control fails, at the sample counts used here; greedy agreement is total on fakes
(they have no batch-versus-single numerics)."""
from __future__ import annotations

import numpy as np
import pytest

from app.reports.exactness_report import console_lines, markdown
from engine.acceptance import verify
from engine.drafters.draft_model import DraftModelDrafter
from engine.errors import SettingsError
from engine.exactness.biased import biased_verify
from engine.exactness.check import ExactnessPlan, run_exactness, total_ticks
from engine.exactness.draws import draw
from engine.exactness.greedy import first_divergence
from engine.sampling import Rng
from engine.session import Session
from tests.fakes import FakeBackend

PROMPT = [3, 4, 5]


class LineFake(FakeBackend):
    """A fake whose token 3, 10, 17, ... ends a line, so the newline statistic varies."""

    def token_bytes(self, token: int) -> bytes:
        return b"x\n" if token % 7 == 3 else super().token_bytes(token)


def setup(seed=1, noise=1.0, draft_scale=3.5):
    target = Session(LineFake(seed=seed, scale=2.0))
    drafter = DraftModelDrafter(LineFake(seed=seed, scale=draft_scale, noise=noise))
    return target, drafter


@pytest.fixture(scope="module")
def report():
    target, drafter = setup()
    ticks = []
    plan = ExactnessPlan(samples=600, seed=0, greedy_tokens=24)
    rep = run_exactness(target, drafter, PROMPT, plan, greedy_prompts=[[1, 2], [9, 8, 7]],
                        tick=ticks.append)
    assert len(ticks) == total_ticks(plan, 2)
    return rep


def test_exact_rule_passes_every_setting(report):
    assert [r.name for r in report.results] == ["temperature 1.0", "temperature 0.7, top-p 0.9",
                                                "top-k 20", "min-p 0.05"]
    for r in report.results:
        assert r.passed, (r.name, [c.p_value for c in r.comparisons])
        assert [c.statistic for c in r.comparisons] == ["first token", "first two tokens",
                                                        "tokens to first newline"]
        assert all(c.n_a == c.n_b == 600 for c in r.comparisons)
        # The newline statistic really varies on this fake.
        assert r.comparisons[2].categories > 3
        assert 0.0 < r.acceptance_rate < 1.0


def test_biased_control_fails(report):
    c = report.control
    assert c is not None and c.rule == "biased" and not c.passed
    assert min(x.p_value for x in c.comparisons) < c.threshold
    assert report.passed


def test_greedy_agreement_is_total_on_fakes(report):
    g = report.greedy
    assert g.rate == 1.0 and len(g.cases) == 2
    assert all(c.plain_tokens == c.speculative_tokens == 24 for c in g.cases)


def test_report_text(report):
    lines = console_lines(report)
    assert lines[0].startswith("PASS  temperature 1.0")
    assert "caught (expected FAIL)" in lines[4] and "FAIL" in lines[4]
    assert lines[-2].startswith("greedy agreement: 2/2 identical") and lines[-1] == "OVERALL: PASS"
    md = markdown(report, {"command": "tandem exactness", "prompt": "p"})
    assert "## Negative control" in md and "**caught**" in md and "TV 95% CI" in md


@pytest.mark.parametrize("seed", [3, 6])
def test_control_fails_for_other_seeds_and_models(seed):
    target, drafter = setup(seed=seed)
    plan = ExactnessPlan(samples=600, seed=seed, settings=ExactnessPlan().settings[:1])
    rep = run_exactness(target, drafter, PROMPT, plan)
    assert rep.results[0].passed and not rep.control.passed


def test_biased_rule_only_differs_on_rejection():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[0.9, 0.1, 0.0]])
    draft = np.array([0], dtype=np.int32)
    exact = [verify(p, q, draft, Rng(s), False) for s in range(400)]
    biased = [biased_verify(p, q, draft, Rng(s), False) for s in range(400)]
    # Same uniforms decide acceptance; rejections correct to token 1 (residual) vs p's mix.
    assert [v.n_accepted for v in exact] == [v.n_accepted for v in biased]
    rejected = [(e.token, b.token) for e, b in zip(exact, biased) if e.n_accepted == 0]
    assert {e for e, _ in rejected} == {1} and {b for _, b in rejected} == {0, 1}


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("kw, msg", [(dict(samples=5), "at least 20"), (dict(gamma=0), "gamma"),
                                     (dict(cap=1), "cap"), (dict(alpha=0), "alpha")])
def test_plan_validation(kw, msg):
    with pytest.raises(SettingsError, match=msg):
        ExactnessPlan(**kw)


def test_padded_batches_stay_exact():
    """Verify batches of 2 and 3 tokens decoded padded to 4, and the draft's catch-up too, as
    `Pair.generate` does on this CPU (engine/widths.py)."""
    from functools import partial

    from engine.widths import padded_width
    costs = [10.0, 30.0, 35.0, 20.0, 50.0]
    target, drafter = setup(seed=2)
    drafter.widths = partial(padded_width, costs)
    widths = partial(padded_width, costs)
    plan = ExactnessPlan(samples=600, seed=5, gamma=2, settings=ExactnessPlan().settings[:2])
    rep = run_exactness(target, drafter, PROMPT, plan, greedy_prompts=[[1, 2]], widths=widths)
    assert any(n == 4 for _, n in target.backend.calls)
    assert all(r.passed for r in rep.results), [[c.p_value for c in r.comparisons]
                                                for r in rep.results]
    assert not rep.control.passed
    assert rep.greedy.identical == len(rep.greedy.cases)


def test_a_setting_where_nothing_was_drafted_is_not_evidence():
    """A policy that stays plain (here the `plain` control) makes both arms plain decoding: the
    comparison passes and shows nothing, so it is reported as not exercised and the report
    does not pass."""
    from app.reports.exactness_report import verdict
    from engine.policy import make_policy
    target, drafter = setup()
    plan = ExactnessPlan(samples=40, seed=0, gamma=3, settings=ExactnessPlan().settings[:1])
    rep = run_exactness(target, drafter, PROMPT, plan, control=False,
                        policy=lambda: make_policy("plain", 3))
    r = rep.results[0]
    assert r.drafted == 0 and not r.exercised and r.passed
    assert verdict(r).startswith("NOT EXERCISED") and not rep.passed
    assert "(0 tokens drafted)" in markdown(rep, {})


class EndingFake(LineFake):
    """A LineFake where six tokens in 64 end the generation, so answers often end early and the
    draft often stops after proposing an end."""

    def is_eog(self, token: int) -> bool:
        return token % 11 == 5


def test_stopping_the_draft_at_an_end_of_generation_token_stays_exact():
    target = Session(EndingFake(seed=1, scale=2.0))
    drafter = DraftModelDrafter(EndingFake(seed=1, scale=3.5, noise=1.0))
    settings = ExactnessPlan().settings[:2]
    proposals = []
    propose = drafter.propose

    def recording(*args, **kwargs):
        p = propose(*args, **kwargs)
        proposals.append(p.tokens.tolist())
        return p

    drafter.propose = recording
    draw(target, drafter, PROMPT, settings[0].params, 100, gamma=4, cap=12, seed=0)
    del drafter.propose
    ends = drafter.session.backend.is_eog
    # The draft really stops after an end token, and never drafts past one.
    assert any(len(t) < 4 and ends(t[-1]) for t in proposals)
    assert not any(ends(x) for t in proposals for x in t[:-1])
    plan = ExactnessPlan(samples=600, seed=6, gamma=4, settings=settings)
    rep = run_exactness(target, drafter, PROMPT, plan)
    assert all(r.passed for r in rep.results), [[c.p_value for c in r.comparisons]
                                                for r in rep.results]
    assert not rep.control.passed
