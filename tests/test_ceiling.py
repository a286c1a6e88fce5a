"""The predicted ceiling (bench/ceiling.py) and `tandem calibrate`'s advice from it, and the
controller block a generation's stats carry (`--json`)."""
from __future__ import annotations

import json

import pytest

from app.runtime.ceiling_advice import suggestions
from bench.ceiling import ceiling
from engine.control.costs import Calibration
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.sampling import SamplingParams
from bench.fakes.costed import PATTERNS, SLOW_DRAFT, script, scripted_pair
from tests.fakes.flat_costs import FLAT

SLOW_CAL = Calibration(draft_ms=list(SLOW_DRAFT.draft), verify_ms=list(SLOW_DRAFT.verify),
                       model_name="draft-model")
FLAT_CAL = Calibration(draft_ms=list(FLAT.draft), verify_ms=list(FLAT.verify),
                       model_name="draft-model")


def test_the_ceiling_follows_the_cost_model():
    c = ceiling(FLAT_CAL, 8)
    # Every drafted token accepted: gamma + 1 tokens for a verify of gamma + 1 and the drafts.
    assert c.model[3] == pytest.approx(4 * 10.0 / (10.3 + 3 * 1.0), abs=1e-3)
    assert c.lookup[3] == pytest.approx(4 * 10.0 / 10.3, abs=1e-3)
    assert c.model[0] == c.lookup[0] == 1.0
    assert c.draft_relative == pytest.approx(0.1)
    # On a flat verify curve a gamma-1 copy breaks even almost at once.
    assert c.lookup_break_even[0] == pytest.approx(0.01, abs=0.002)
    assert c.model_pays and c.lookup_pays


def test_where_the_draft_cannot_pay_calibrate_says_what_might():
    # This CPU's verify curve with a draft at 0.7 of the target.
    c = ceiling(SLOW_CAL, 8)
    assert not c.model_pays
    assert all(b is None or b > 0.9 for b in c.model_break_even)
    tips = suggestions(c, has_draft=True)
    assert any(t.startswith("prompt lookup") for t in tips) == c.lookup_pays
    assert any("smaller or requantized draft" in t and "this one costs 0.70" in t for t in tips)
    assert any(t.startswith("a GPU") for t in tips)
    # A pair that pays needs no advice.
    assert suggestions(ceiling(FLAT_CAL, 8), has_draft=True) == []


def test_a_generation_carries_the_controller_block():
    s = script(PATTERNS["high"], 0)
    pair, _ = scripted_pair(FLAT, s)
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=24)
    done = [ev for ev in pair.generate(s.prompt_text, config, raw=True)
            if isinstance(ev, DoneEvent)][0]
    block = json.loads(json.dumps(done.stats.as_dict()))["controller"]
    assert block["policy"] == "adaptive" and block["reason"] == done.stats.reason
    assert len(block["verify_ms"]) >= 5 and block["verify_ms"][0] == pytest.approx(10.0)
    # The model's cost, and every copying part that planned a round in the answer at none.
    cost = block["draft_cost"]
    assert cost.pop("draft-model") == pytest.approx(0.1, abs=0.02)
    assert set(cost) <= {"prompt-lookup", "suffix"} and not any(cost.values())
    assert len(block["predicted_speedup"]) == 5 and block["predicted_speedup"][0] == 1.0
    assert block["gamma"] == done.stats.gammas[-1] or block["gamma"] > done.stats.gammas[-1]


def test_the_wizard_formats_the_ceiling_and_waits_for_the_files():
    from app.ui.wizard import ceiling_html, measure_ceiling
    page = ceiling_html(ceiling(SLOW_CAL, 4))
    assert "cannot pay" in page and "The draft costs 0.70 of a target token" in page
    assert page.count("<tr>") == 5 and "What might pay instead" in page
    assert "pays" in ceiling_html(ceiling(FLAT_CAL, 4)) and "What might" not in ceiling_html(
        ceiling(FLAT_CAL, 4))
    assert "Not on disk yet" in measure_ceiling("some/repo", "absent.gguf", "some/repo",
                                                "absent-draft.gguf", 4096)


def test_calibrate_measures_the_widths_parallel_sequences_reach_and_the_batch_shrinks_gamma():
    from bench.ceiling import measure
    pair, _ = scripted_pair(FLAT, script(PATTERNS["high"], 0))
    alone = measure(pair, 8)
    assert alone.batches == [] and len(alone.verify_ms) < 36
    four = measure(pair, 8, parallel=4)
    # Four sequences drafting gamma 8 reach a step of 36 rows: measured, not extrapolated.
    assert len(four.verify_ms) >= 36
    assert [b.sequences for b in four.batches] == [1, 2, 3, 4]
    gammas = [b.model_gamma for b in four.batches]
    assert all(a >= b for a, b in zip(gammas, gammas[1:])) and gammas[-1] < gammas[0], gammas
    # A batch of one is the ceiling's own best at the typical acceptance.
    assert four.batches[0].model_speedup == pytest.approx(max(four.model_typical), abs=1e-3)
    assert four.batches[0].lookup_speedup == pytest.approx(max(four.lookup_typical), abs=1e-3)
    assert four.batches[0].plain_cost == 1.0


def test_calibrates_batch_lines_and_its_refusal_of_no_sequences(capsys):
    from app import cli
    from app.calibrate_cli import _batch_table
    c = ceiling(FLAT_CAL, 8, parallel=2)
    lines = _batch_table(c, has_draft=True)
    assert lines[0].startswith("batches (--parallel 2), every sequence drafting alike")
    assert len(lines) == 4 and lines[2].split("|")[0].strip() == "1"
    assert _batch_table(ceiling(FLAT_CAL, 8), has_draft=True) == []
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--target", "t.gguf", "--parallel", "0"])
    assert "expected a number of sequences >= 1, got '0'" in capsys.readouterr().err


def test_a_batch_figure_counts_every_sequences_draft_decodes():
    """n sequences drafting alike through the draft model: the step holds the target at n(g + 1)
    rows and, at each depth, one draft decode of all n drafts (as bench/research/batch_replay.py
    prices it). On the measured H200 profile (a draft token 0.50 of a target token) two
    sequences drafting cannot pay; eight drafting 1 each can, a little."""
    from bench.benchmark.gpu_profile import measured
    from bench.ceiling import TYPICAL_ACCEPTANCE, batch_figures
    from engine.control.costs import CostModel
    gpu = measured()
    cal = Calibration(gpu.draft_table(80), gpu.verify_table(80), "draft")
    figures = batch_figures(cal, 8, 8)
    assert figures[1].model_gamma == 0 and figures[1].model_speedup == 1.0
    costs = CostModel(cal, rate=0.0)
    e = 1.0 + TYPICAL_ACCEPTANCE
    drafting = 8 * e / (costs.verify_cost(16) + cal.draft_ms[7])
    assert figures[7].model_gamma == 1
    assert figures[7].model_speedup == pytest.approx(drafting * costs.verify_cost(8) / 8,
                                                     abs=1e-3)
