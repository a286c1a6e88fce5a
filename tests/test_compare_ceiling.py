"""The side-by-side tab states the machine's measured ceiling beside its result (issue 62): what
the speculative run's calibration lets a copy and the draft model reach, every drafted token
accepted (bench/ceiling.py `reach`), where that calibration came from (kept by an earlier
process and when it was measured, measured by this one, or measured on a busy machine and not
kept), and how the result compares, on either side of 1; with no calibration yet it says so.
Over scripted fakes on a virtual clock: nothing is timed."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.runtime.holder import PairHolder
from app.ui import compare, controls
from app.ui.state import StopFlags
from bench.ceiling import reach
from engine.control.costs import Calibration
from loading.calibrations import CalibrationFile, Origin
from tests.test_app_units import OFFER
from tests.test_calibrations import PROMPT, busy_knowledge, counted_pair, ident

# The issue's Zen 4 curve (a verify of w tokens, in one-token decodes) and a draft at 0.32.
ISSUE = {1: 1.0, 2: 2.02, 4: 3.37, 8: 7.99, 9: 9.32, 12: 10.4, 16: 9.05, 24: 13.3, 32: 15.6,
         48: 21.8, 64: 27.8, 65: 28.3}


def hybrid_spec():
    spec = controls.spec(OFFER, "hybrid", "adaptive", 8, 0.0, 0, 1.0, 0.0, -1, 24)
    return replace(spec, raw=True)


def run_compare(holder: PairHolder) -> tuple[str, dict]:
    *_, (_, _, summary, results) = compare.compare(holder, StopFlags(), "s", PROMPT.prompt_text,
                                                   hybrid_spec(), 1)
    return summary, results


def held(pair, store: CalibrationFile | None) -> PairHolder:
    holder = PairHolder(pair)
    holder.calibrations = store
    return holder


def test_the_ceiling_is_the_calibrations_and_says_it_was_measured_here_then_kept_for_the_next(tmp_path):
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    store = CalibrationFile(path, ident(first))
    first.knowledge.keep_calibrations_in(store)
    summary, results = run_compare(held(first, store))
    c = results["ceiling"]
    cal = first.knowledge["hybrid"]
    expected = reach(cal, 64, 8)
    assert (c["copy_gamma"], c["copy"], c["model_gamma"], c["model"]) == (
        expected.copy_gamma, expected.copy, expected.model_gamma, expected.model)
    assert c["kept"] == str(path) and c["earlier_process"] is False and c["not_kept"] == ""
    measured = json.loads(path.read_text())["drafters"]["hybrid"]["measured"]
    assert c["measured"] == measured and measured.endswith("UTC")
    assert f"a copy of {expected.copy_gamma} tokens {expected.copy:.2f}x plain" in summary
    assert f"measured by this process at {measured}, kept in {path}" in summary
    # The curve quoted is the calibration's, at the widths it measured.
    assert c["curve"][0] == [2, round(cal.verify_ms[1] / cal.verify_ms[0], 2)] or \
        c["curve"][0] == (2, round(cal.verify_ms[1] / cal.verify_ms[0], 2))
    assert [w for w, _ in c["curve"]] == [2, 4, 8, 16, 32, 64]

    # A new process over the same store runs with the kept calibration and says whose it is.
    again, target, _ = counted_pair()
    store = CalibrationFile(path, ident(again))
    again.knowledge.keep_calibrations_in(store)
    summary, results = run_compare(held(again, store))
    assert results["ceiling"]["earlier_process"] is True
    assert f"kept in {path} by an earlier process, measured {measured}" in summary
    assert results["ceiling"]["copy"] == expected.copy


def test_a_busy_calibration_is_said_to_be_not_kept_and_a_pair_without_a_store_says_so(tmp_path):
    pair, _, _ = counted_pair()
    store = CalibrationFile(tmp_path / "pair.json", ident(pair))
    pair.knowledge = busy_knowledge(store, 0.6)
    summary, results = run_compare(held(pair, store))
    assert results["ceiling"]["kept"] is None
    assert "not kept (the machine was busy while calibrating: other programs used 60%" in summary
    assert "the next process measures again" in summary

    bare, _, _ = counted_pair()
    summary, results = run_compare(held(bare, None))
    assert results["ceiling"]["calibrated"] is True and results["ceiling"]["kept"] is None
    assert "this pair keeps no calibrations" in summary


def ceiling_of(points: dict[int, float], draft: float | None) -> compare.MachineCeiling:
    cal = Calibration.from_points(points, {1: draft} if draft is not None else None)
    origin = Origin("2026-12-07 01:00:00 UTC", None, earlier=True)
    return compare.MachineCeiling("hybrid", cal, reach(cal, 64, 8), origin)


def test_the_result_is_set_beside_the_ceiling_on_either_side_of_1():
    c = ceiling_of(ISSUE, 0.32)
    r = c.reach
    assert r is not None and r.copy_gamma == 63 and r.copy == pytest.approx(64 / 27.8, abs=1e-3)
    # The draft model at 0.32 of a token cannot pay on this curve even all accepted.
    assert r.model is not None and r.model < 1
    slower, faster, above = (compare.ceiling_words(c, s) for s in (0.98, 1.35, 2.5))
    assert "this run: 0.98x, slower than plain decoding, 43% of the ceiling" in slower[-1]
    assert "this run: 1.35x, faster than plain decoding" in faster[-1]
    assert "above it" in above[-1] and "above it" not in faster[-1]
    assert "a copy of 63 tokens 2.30x plain" in faster[0]
    assert f"the draft model {r.model:.2f}x at gamma {r.model_gamma}" in faster[0]
    assert "measured 2026-12-07 01:00:00 UTC" in faster[1]
    assert "16: 9.05" in faster[1] and "64: 27.80" in faster[1]

    # A curve on which nothing can beat plain: said, whatever the run's figure.
    flat = ceiling_of({1: 1.0, 2: 2.5, 9: 12.0}, None)
    words = compare.ceiling_words(flat, 0.97)
    assert flat.reach is not None and flat.reach.model is None and flat.reach.copy < 1
    assert "cannot beat plain decoding" in words[-1] and "draft model" not in words[0]
    assert "calibrated to 9 tokens only" in words[0]


def test_with_no_calibration_yet_no_ceiling_is_invented():
    pair, _, _ = counted_pair()
    c = compare.machine_ceiling(pair, None, "hybrid", 8)
    assert c.reach is None and c.as_dict()["copy"] is None
    assert compare.ceiling_words(c, 1.2) == [
        "no calibration of hybrid on this machine yet, so no measured ceiling to set this "
        "result beside"]


def test_the_holder_hands_on_where_the_loaded_pairs_calibrations_are_kept(tmp_path, monkeypatch):
    from bench.fakes.backend import FakeBackend
    from engine.backend import ModelConfig
    from loading.calibrations import calibrations_dir
    from tests import tinygguf
    from tests.test_app_units import FAKE_OPTS

    monkeypatch.setenv("TANDEM_CALIBRATIONS", str(tmp_path / "calibrations"))
    t = tinygguf.write(tmp_path / "t.gguf", tokens=tinygguf.vocab(400))
    d = tinygguf.write(tmp_path / "d.gguf", tokens=tinygguf.vocab(400))
    holder = PairHolder(loader=lambda config: FakeBackend())
    assert holder.load(ModelConfig(str(t)), ModelConfig(str(d)), FAKE_OPTS) is None
    kept = holder.calibrations
    assert kept is not None and kept.path.parent == calibrations_dir()
    holder.pair.calibration("hybrid", 8)
    origin = kept.origin("hybrid")
    assert origin is not None and origin.earlier is False
    # A pair handed in later keeps none: the file of the one it replaced is not its own.
    holder.replace(counted_pair()[0])
    assert holder.calibrations is None
    holder.close()
