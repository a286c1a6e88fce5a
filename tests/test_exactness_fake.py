"""The exactness check on fake models: the exact rule passes every setting and the calibrated
negative control fails; greedy agreement is total on fakes (they have no batch-versus-single
numerics). The check compares the positions a fresh adaptive controller drafts, and says
which ones were drafted and how small a bias each comparison can see."""
from __future__ import annotations

import numpy as np
import pytest

from app.reports.exactness_report import console_lines, markdown, verdict
from engine.acceptance import residual, verify
from engine.control.controller import AdaptiveController
from engine.dist import Dist
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.errors import SettingsError
from bench.exactness.biased import CalibratedBias, biased_verify
from bench.exactness.check import ExactnessPlan, run_exactness, total_ticks
from bench.exactness.draws import draw
from bench.exactness.greedy import first_divergence
from engine.control.registry import make_policy
from engine.rng import Rng
from engine.session import Session
from bench.fakes.table import TableFake
from bench.fakes.backend import FakeBackend

PROMPT = [3, 4, 5]


def setup(seed=1, noise=1.0, draft_scale=3.5):
    target = Session(FakeBackend(seed=seed, scale=2.0))
    drafter = DraftModelDrafter(FakeBackend(seed=seed, scale=draft_scale, noise=noise))
    return target, drafter


@pytest.fixture(scope="module")
def report():
    target, drafter = setup()
    ticks = []
    plan = ExactnessPlan(samples=600, seed=0, tokens=4, greedy_tokens=24, control_tv=0.1)
    rep = run_exactness(target, drafter, PROMPT, plan, greedy_prompts=[[1, 2], [9, 8, 7]],
                        tick=ticks.append)
    assert len(ticks) == total_ticks(plan, 2)
    return rep


def test_exact_rule_passes_every_setting(report):
    assert [r.name for r in report.results] == ["temperature 1.0", "temperature 0.7, top-p 0.9",
                                                "top-k 20", "min-p 0.05"]
    for r in report.results:
        assert r.passed, (r.name, [c.p_value for c in r.comparisons])
        assert [c.statistic for c in r.comparisons] == ["tokens -1,0", "tokens 0,1",
                                                        "tokens 1,2", "tokens 2,3"]
        assert all(c.n_a == c.n_b == 600 for c in r.comparisons)
        assert 0.0 < r.acceptance_rate < 1.0
        # Fixed gamma drafts from the first token on.
        assert len(r.drafted_share) == 4 and min(r.drafted_share) > 0
        assert all(0 < d <= 1 for d in r.detectable) and r.smallest_detectable < 0.2


def test_biased_control_fails(report):
    c = report.control
    assert c is not None and c.rule == "biased" and not c.passed
    assert min(x.p_value for x in c.comparisons) < c.threshold
    assert c.bias_tv == pytest.approx(0.1, rel=0.05)
    assert report.passed


def test_greedy_agreement_is_total_on_fakes(report):
    g = report.greedy
    assert g.rate == 1.0 and len(g.cases) == 2
    assert all(c.plain_tokens == c.speculative_tokens == 24 for c in g.cases)


def test_report_text(report):
    lines = console_lines(report)
    assert lines[0].startswith("PASS  temperature 1.0") and "smallest detectable TV" in lines[0]
    assert "drafted in" in lines[0] and "detects TV >=" in lines[0]
    assert "caught (expected FAIL)" in lines[4] and "FAIL" in lines[4]
    assert "bias 0.100 per verified round" in lines[4]
    assert lines[-2].startswith("greedy agreement: 2/2 identical") and lines[-1] == "OVERALL: PASS"
    md = markdown(report, {"command": "tandem exactness", "prompt": "p"})
    assert "## Negative control" in md and "**caught**" in md and "detectable TV" in md


def test_the_calibrated_control_adds_the_bias_it_is_set_to():
    """Its first emitted token is off by eps * TV(p, q) * TV(p, r): computed over every outcome
    of one round, the bias is what the rule reports."""
    p_rows = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]])
    p = [Dist.dense(r) for r in p_rows]
    q = [Dist.dense([0.2, 0.6, 0.2])]
    rule = CalibratedBias(target=0.05)
    law = np.zeros(3)
    n = 40000
    for s in range(n):
        x = Rng(s).draw(q[0])
        v = rule(p, q, np.array([x]), Rng(s + 10**6), False)
        law[x if v.n_accepted else v.token] += 1
    assert rule.mean_tv == pytest.approx(0.05)
    assert 0.5 * np.abs(law / n - p_rows[0]).sum() == pytest.approx(0.05, abs=0.008)
    r = residual(p[0], q[0]).to_dense()
    tv = 0.5 * np.abs(p_rows[0] - q[0].to_dense()).sum() * 0.5 * np.abs(p_rows[0] - r).sum()
    assert rule.eps == pytest.approx(0.05 / tv)


@pytest.mark.long
def test_a_control_of_tv_0_03_on_the_default_path_is_caught_and_the_exact_path_passes():
    """The default path (hybrid, a fresh adaptive controller per answer, so its opening tokens
    are plain): positions 3-6 are compared, they were drafted, and at 10,000 answers per arm the
    check sees a bias of 0.03."""
    target = Session(TableFake(seed=2, scale=2.0))
    draft = TableFake(seed=2, scale=2.0, noise=0.8)
    drafter = HybridDrafter(PromptLookupDrafter(ngram_min=2), DraftModelDrafter(draft))
    gpu = dict(draft_ms=[1.0 + 0.1 * w for w in range(9)],
               verify_ms=[10.0 + 0.3 * w for w in range(9)], model_name="draft-model")
    plan = ExactnessPlan(samples=10_000, gamma=4, tokens=7, first=3, seed=1,
                         settings=ExactnessPlan().settings[1:2])
    rep = run_exactness(target, drafter, [1, 2, 3, 1], plan,
                        policy=lambda: make_policy("adaptive", 4, **gpu))
    r = rep.results[0]
    assert r.passed and min(r.drafted_share) > 0.2
    assert r.smallest_detectable < 0.03
    assert not rep.control.passed and rep.control.bias_tv == pytest.approx(0.03, rel=0.05)


@pytest.mark.parametrize("seed", [3, 6])
def test_control_fails_for_other_seeds_and_models(seed):
    target, drafter = setup(seed=seed)
    # The full bias (a rejection always resamples from p): what 600 answers can see.
    plan = ExactnessPlan(samples=600, seed=seed, tokens=3, control_tv=0.99,
                         settings=ExactnessPlan().settings[:1])
    rep = run_exactness(target, drafter, PROMPT, plan)
    assert rep.results[0].passed and not rep.control.passed


def test_biased_rule_only_differs_on_rejection():
    p = [Dist.dense([0.5, 0.5, 0.0]), Dist.dense([0.2, 0.3, 0.5])]
    q = [Dist.dense([0.9, 0.1, 0.0])]
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
                                     (dict(first=7), "first compared"), (dict(alpha=0), "alpha"),
                                     (dict(control_tv=0), "control")])
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
    drafter.pad_catch_up(partial(padded_width, costs))
    widths = partial(padded_width, costs)
    plan = ExactnessPlan(samples=600, seed=5, gamma=2, tokens=3, control_tv=0.99,
                         settings=ExactnessPlan().settings[:2])
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
    target, drafter = setup()
    plan = ExactnessPlan(samples=40, seed=0, gamma=3, tokens=3,
                         settings=ExactnessPlan().settings[:1])
    rep = run_exactness(target, drafter, PROMPT, plan, control=False,
                        policy=lambda: make_policy("plain", 3))
    r = rep.results[0]
    assert r.drafted == 0 and not r.exercised and r.passed
    assert verdict(r).startswith("NOT EXERCISED") and not rep.passed
    assert "(0 tokens drafted)" in markdown(rep, {})
    assert r.drafted_share == (0.0, 0.0, 0.0)


def test_an_adaptive_controller_with_a_plain_opening_drafts_nothing_there():
    """Why the check can start after a forced plain opening: those positions are plain."""
    target, drafter = setup()
    gpu = dict(draft_ms=[1.0] * 9, verify_ms=[10.0] * 9, model_name="draft-model",
               opening_plain=3)
    d = draw(target, drafter, PROMPT, ExactnessPlan().settings[0].params, 30, gamma=4, tokens=6,
             seed=0, policy=lambda: AdaptiveController(max_gamma=4, **gpu))
    assert d.drafted_at[:3] == [0, 0, 0] and sum(d.drafted_at[3:]) > 0


class EndingFake(FakeBackend):
    """A fake where six tokens in 64 end the generation, so answers often end early and the
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
    draw(target, drafter, PROMPT, settings[0].params, 100, gamma=4, tokens=6, seed=0)
    del drafter.propose
    ends = drafter.session.backend.is_eog
    # The draft really stops after an end token, and never drafts past one.
    assert any(len(t) < 4 and ends(t[-1]) for t in proposals)
    assert not any(ends(x) for t in proposals for x in t[:-1])
    plan = ExactnessPlan(samples=600, seed=6, gamma=4, tokens=4, control_tv=0.99,
                         settings=settings)
    rep = run_exactness(target, drafter, PROMPT, plan)
    assert all(r.passed for r in rep.results), [[c.p_value for c in r.comparisons]
                                                for r in rep.results]
    assert not rep.control.passed
