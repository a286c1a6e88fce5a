"""Calibrations at the widths copies use, kept across processes: `calibrate` times the target at
sparse widths to 65 and the draft at its own (engine/control/costs.py), every reader sees a cost
at every width between them, and loading/calibrations.py keeps them for one pair, machine, build
and settings, so a second pair over the same store makes no calibration decode; a damaged file,
other settings or another machine mean measuring again, and a busy machine's calibration is
said so and not kept. Decodes are counted on fakes over a virtual clock, never timed."""
from __future__ import annotations

import json
import stat
from dataclasses import replace
from typing import Sequence

import numpy as np
import pytest

from app.runtime import open_pair as opening
from app.runtime.open_pair import PairRequest, open_pair
from bench.fakes.costed import CPU, PATTERNS, Profile, ScriptedFake, script
from bench.fakes.table import VirtualClock
from engine.backend import ModelConfig, Part
from engine.control.costs import (DRAFT_WIDTHS, VERIFY_WIDTHS, Calibration, CostModel, at_width,
                                  busy_line, dense)
from engine.generation_config import GenerationConfig
from engine.knowledge import CALIBRATION_TEXT, Knowledge
from engine.machine_load import cpu_busy_s, no_load, others_share
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.widths import padded_width
from loading.calibrations import (CalibrationFile, calibrations_dir, calibrations_path,
                                  restored, stored)
from loading.evidence import evidence_dir, identity
from loading.options import LoadOptions
from models.tuned import PairKey
from tests import tinygguf
from tests.test_open_pair import CPU_ONLY

KEY = PairKey("c" * 64, "", "d" * 64)
COPY_GAMMA = 64
# What the target and the draft cost a decode of 1..65 tokens on the virtual clock: this CPU's
# curve to 9, then 0.4 of a token a row (a wide batch's pace).
WIDE = Profile("wide", tuple(CPU.verify) + tuple(CPU.verify[-1] + 4.0 * k for k in range(1, 57)),
               tuple(CPU.draft) + tuple(CPU.draft[-1] + 1.4 * k for k in range(1, 57)))


class Counted(ScriptedFake):
    """A scripted fake that notes the width of every decode it is asked for; with `jitter`,
    each decode costs a random 1 to 3 times its price (another program's load)."""

    def __init__(self, *args, jitter: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.widths: list[int] = []
        self.rng = np.random.default_rng(jitter) if jitter is not None else None

    def decode_batch(self, parts: Sequence[Part]) -> list[np.ndarray]:
        width = sum(len(p.tokens) for p in parts)
        self.widths.append(width)
        if self.rng is not None:
            self.clock.ms += float(self.rng.uniform(0.0, 2.0)) * self.cost[min(width, 65) - 1]
        return super().decode_batch(parts)


PROMPT = script(PATTERNS["high"], 0)
GREEDY = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8, max_tokens=8)


def counted_pair(jitter: int | None = None) -> tuple[Pair, Counted, Counted]:
    s = script(PATTERNS["high"], 0)
    clock = VirtualClock()
    target = Counted(s, clock, WIDE.verify, jitter=jitter)
    draft = Counted(s, clock, WIDE.draft, draft=True)
    return Pair(target, draft, clock=clock.now), target, draft


def ident(pair: Pair, **changed) -> dict:
    return {**identity(KEY, pair), "settings": {"target": {"threads": 2}}, **changed}


def calibrate_to_copies(pair: Pair) -> Calibration:
    return pair.calibration("hybrid", COPY_GAMMA)


# Sparse widths, interpolated ------------------------------------------------------------------

def test_the_target_is_timed_at_sparse_widths_to_65_and_the_draft_at_its_own():
    pair, target, draft = counted_pair()
    cal = calibrate_to_copies(pair)
    widest = COPY_GAMMA + 1
    assert cal.verify_widths == (*VERIFY_WIDTHS, widest)
    assert cal.draft_widths == DRAFT_WIDTHS and max(DRAFT_WIDTHS) < COPY_GAMMA
    # Four sweeps of each measured width, after the prompt and one warm-up decode, nothing else.
    timed = target.widths[2:]
    assert sorted(set(timed)) == list(cal.verify_widths)
    assert all(timed.count(w) == 4 for w in cal.verify_widths)
    assert max(draft.widths[2:]) == max(DRAFT_WIDTHS)
    # Every reader sees a cost at every width, the draft's as far as the target's.
    assert len(cal.verify_ms) == len(cal.draft_ms) == widest
    assert cal.verify_ms[widest - 1] == WIDE.verify[widest - 1]
    # The fake's curve is straight past 9, so interpolating it is exact.
    assert cal.verify_ms[19] == pytest.approx(WIDE.verify[19])
    assert cal.draft_ms[39] == pytest.approx(WIDE.draft[39])
    costs = CostModel(cal, rate=0.0)
    assert costs.verify_cost(40) == pytest.approx(WIDE.verify[39])


def test_a_calibration_within_9_is_timed_at_every_width_as_before():
    pair, target, _ = counted_pair()
    cal = pair.calibration("hybrid", 8)
    assert cal.verify_widths == tuple(range(1, 10)) == cal.draft_widths
    assert sorted(set(target.widths[2:])) == list(range(1, 10))


def test_costs_between_measured_widths_are_interpolated_and_padding_lands_on_a_measured_one():
    # Nine tokens cost more than sixteen (issue 62's curve, in target tokens).
    points = {1: 1.0, 2: 2.02, 4: 3.37, 8: 7.99, 9: 9.32, 12: 10.4, 16: 9.05, 24: 13.3}
    cal = Calibration.from_points(points, {1: 0.3, 2: 0.5})
    assert cal.verify_ms[2] == pytest.approx((2.02 + 3.37) / 2)
    assert cal.verify_ms[9] == pytest.approx(9.32 + (10.4 - 9.32) / 3)
    assert at_width(cal.verify_ms, 20) == pytest.approx((9.05 + 13.3) / 2)
    # The draft goes on past its widest at the pace of its last two widths.
    assert cal.draft_ms[:4] == pytest.approx((0.3, 0.5, 0.7, 0.9))
    assert padded_width(cal.verify_ms, 10) == 16 and padded_width(cal.verify_ms, 17) == 17
    assert cal.points() == (points, {1: 0.3, 2: 0.5})
    with pytest.raises(Exception, match="one token"):
        dense({2: 1.0}, 4)


# Kept across processes --------------------------------------------------------------------------

def test_a_second_pair_over_the_same_store_makes_no_calibration_decode(tmp_path):
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    first.knowledge.keep_calibrations_in(CalibrationFile(path, ident(first)))
    cal = calibrate_to_copies(first)
    assert json.loads(path.read_text())["drafters"]["hybrid"]["model"] == "fake-0-0.0"

    again, target, draft = counted_pair()
    again.knowledge.keep_calibrations_in(CalibrationFile(path, ident(again)))
    restored_cal = calibrate_to_copies(again)
    assert target.widths == [] and draft.widths == []
    assert restored_cal.verify_ms == pytest.approx(cal.verify_ms)
    assert restored_cal.draft_ms == pytest.approx(cal.draft_ms)
    # A narrower need is served by the wider calibration.
    assert again.calibration("hybrid", 8) is restored_cal
    # A third process's first answer decodes no calibration: its first decode is the prompt's
    # (all but the last token), where without the store it is the calibration's text.
    calibration_text = again.tokens_for(CALIBRATION_TEXT, raw=True)
    for kept, first_width in ((True, len(PROMPT.prompt) - 1), (False, len(calibration_text))):
        third, target, _ = counted_pair()
        if kept:
            third.knowledge.keep_calibrations_in(CalibrationFile(path, ident(third)))
        list(third.generate(PROMPT.prompt_text, GREEDY, raw=True))
        assert target.widths[0] == first_width


def test_a_narrower_kept_calibration_is_measured_again_to_the_width_asked(tmp_path):
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    first.knowledge.keep_calibrations_in(CalibrationFile(path, ident(first)))
    first.calibration("hybrid", 8)
    again, target, _ = counted_pair()
    again.knowledge.keep_calibrations_in(CalibrationFile(path, ident(again)))
    calibrate_to_copies(again)
    assert COPY_GAMMA + 1 in target.widths
    kept = json.loads(path.read_text())["drafters"]["hybrid"]["verify"]
    assert kept[-1][0] == COPY_GAMMA + 1


def test_an_entry_kept_by_a_build_that_timed_fewer_widths_is_measured_again(tmp_path):
    # Kept before the multiples of 16 were timed with their neighbours: 15, 17, 31, ... are
    # missing, so the entry's interpolated costs are not trusted and the target is timed again.
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    first.knowledge.keep_calibrations_in(CalibrationFile(path, ident(first)))
    calibrate_to_copies(first)
    found = json.loads(path.read_text())
    old_grid = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64, COPY_GAMMA + 1}
    entry = found["drafters"]["hybrid"]
    entry["verify"] = [[w, ms] for w, ms in entry["verify"] if w in old_grid]
    path.write_text(json.dumps(found))
    again, target, _ = counted_pair()
    again.knowledge.keep_calibrations_in(CalibrationFile(path, ident(again)))
    cal = calibrate_to_copies(again)
    assert sorted(set(target.widths[2:])) == list(cal.verify_widths) == [*VERIFY_WIDTHS, COPY_GAMMA + 1]
    assert [w for w, _ in json.loads(path.read_text())["drafters"]["hybrid"]["verify"]] == list(cal.verify_widths)
    # The control: the entry as this build keeps it is restored without a decode.
    third, target, _ = counted_pair()
    third.knowledge.keep_calibrations_in(CalibrationFile(path, ident(third)))
    calibrate_to_copies(third)
    assert target.widths == []


def test_each_multiple_of_16_is_timed_with_its_neighbours():
    for m in (16, 32, 48):
        assert {m - 1, m, m + 1} <= set(VERIFY_WIDTHS)
    assert {63, 64} <= set(VERIFY_WIDTHS) and max(VERIFY_WIDTHS) == COPY_GAMMA
    # Over such a grid a verify of 31 is priced from its own measurement, not from 24 and 32.
    curve = {w: float(w) for w in range(1, 66)}
    curve.update({16: 12.0, 32: 25.0, 48: 40.0, 64: 52.0})
    cal = Calibration.from_points({w: curve[w] for w in (*VERIFY_WIDTHS, 65)}, None)
    assert cal.verify_ms[30] == pytest.approx(31.0) and cal.verify_ms[31] == pytest.approx(25.0)
    assert padded_width(cal.verify_ms, 30) == 32 and padded_width(cal.verify_ms, 20) == 20


@pytest.mark.parametrize("change", ["settings", "machine", "model"])
def test_other_settings_another_machine_or_another_model_recalibrate(tmp_path, change):
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    first.knowledge.keep_calibrations_in(CalibrationFile(path, ident(first)))
    first.calibration("hybrid", 8)
    again, target, _ = counted_pair()
    other = ident(again)
    if change == "settings":
        other = ident(again, settings={"target": {"threads": 1}})
    elif change == "machine":
        other = ident(again, machine="another machine")
    store = CalibrationFile(path, other)
    if change == "model":
        # The drafter's model as loaded is another (a requantized draft, say).
        assert store.restore("hybrid", "another.gguf", 9) is None
        assert store.restore("hybrid", "fake-0-0.0", 9) is not None
        return
    again.knowledge.keep_calibrations_in(store)
    again.calibration("hybrid", 8)
    assert target.widths != []
    # Kept for the new identity now; the old one's file is replaced.
    assert json.loads(path.read_text())["identity"] == other


@pytest.mark.parametrize("damage", ["{not json", '{"format": 1, "drafters": []}',
                                    "bad entry", "negative cost"])
def test_a_damaged_file_means_measuring_again_never_a_crash(tmp_path, damage, capsys):
    path = tmp_path / "pair.json"
    first, _, _ = counted_pair()
    first.knowledge.keep_calibrations_in(CalibrationFile(path, ident(first)))
    first.calibration("hybrid", 8)
    good = json.loads(path.read_text())
    if damage == "bad entry":
        good["drafters"]["hybrid"]["verify"] = [[1, "x"]]
        damage = json.dumps(good)
    elif damage == "negative cost":
        good["drafters"]["hybrid"]["verify"][3][1] = -1.0
        damage = json.dumps(good)
    path.write_text(damage)
    again, target, _ = counted_pair()
    again.knowledge.keep_calibrations_in(CalibrationFile(path, ident(again)))
    again.calibration("hybrid", 8)
    assert target.widths != []
    # Written whole again.
    assert restored(json.loads(path.read_text())["drafters"]["hybrid"]).verify_widths
    # A file that cannot be parsed is set aside, with its one line; a bad entry is ignored.
    unparsed = not damage.startswith('{"format": 1, "identity"')
    assert bool(list(tmp_path.glob("pair.json.corrupt-*"))) == unparsed
    assert ("could not be read" in capsys.readouterr().err) == unparsed


def test_an_entry_round_trips_and_a_partial_one_is_refused():
    cal = Calibration.from_points({1: 10.0, 2: 14.0, 9: 60.0}, {1: 3.0, 2: 4.0})
    back = restored(json.loads(json.dumps(stored(cal))))
    assert back.verify_ms == cal.verify_ms and back.draft_ms == cal.draft_ms
    lookup = Calibration.from_points({1: 10.0, 2: 14.0}, None)
    assert restored(stored(lookup)).draft_ms == (0.0, 0.0)
    for bad in ({}, {"verify": [[2, 1.0]]}, {"verify": [[1, 1.0], [1, 2.0]]},
                {"verify": [[1, True]]}, {"verify": [[1, 1.0]], "draft": [[1, float("nan")]]},
                {"verify": [[1, 1.0]], "model_name": 3}, []):
        with pytest.raises(ValueError):
            restored(bad)


# A busy machine -----------------------------------------------------------------------------------

def busy_knowledge(store: CalibrationFile, share: float | None) -> Knowledge:
    knowledge = Knowledge(load=lambda: (lambda: share))
    knowledge.keep_calibrations_in(store)
    return knowledge


def test_a_calibration_on_a_busy_machine_is_said_and_not_kept(tmp_path, capsys):
    path = tmp_path / "pair.json"
    pair, _, _ = counted_pair()
    store = CalibrationFile(path, ident(pair))
    pair.knowledge = busy_knowledge(store, 0.6)
    cal = pair.calibration("hybrid", 8)
    assert "other programs used 60% of its CPUs" in cal.busy
    assert not path.exists() and store.kept == cal.busy
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "not kept" in err[0] and "busy" in err[0]
    # The next process finds none and measures again; idle, it is kept.
    again, target, _ = counted_pair()
    again.knowledge = busy_knowledge(CalibrationFile(path, ident(again)), 0.05)
    assert again.calibration("hybrid", 8).busy == ""
    assert target.widths != [] and path.exists()
    # A busy one later does not replace the idle one kept.
    kept = path.read_text()
    third, _, _ = counted_pair()
    third.knowledge = busy_knowledge(CalibrationFile(path, ident(third), reuse=False), 0.9)
    third.calibration("hybrid", 8)
    assert path.read_text() == kept


def test_sweeps_that_disagree_mark_the_calibration_busy():
    jittered, _, _ = counted_pair(jitter=5)
    cal = jittered.calibration("hybrid", 8)
    assert "timings of one width differed" in cal.busy
    steady, _, _ = counted_pair()
    assert steady.calibration("hybrid", 8).busy == ""


def test_the_machines_load_is_read_from_the_cpu_counters_less_this_process():
    stat_text = "cpu  300 0 100 1600 0 0 0 0 0 0\ncpu0 1 1 1 1"
    assert cpu_busy_s(stat_text, 100.0) == 4.0
    assert cpu_busy_s("intr 5", 100.0) is None and cpu_busy_s("cpu a b", 100.0) is None
    # 4 s of 2 CPUs over 4 s busy, 3 of them this process: others took an eighth.
    assert others_share(busy_s=4.0, own_s=3.0, wall_s=4.0, cpus=2) == 0.125
    assert others_share(busy_s=1.0, own_s=0.0, wall_s=0.1, cpus=2) is None
    assert no_load()() is None
    assert busy_line(0.2, 0.1) == "" and "differed by 40%" in busy_line(None, 0.4)


# The store's own files, wired where every command opens its pair ---------------------------------

@pytest.fixture
def files(tmp_path, monkeypatch):
    for env, sub in (("TANDEM_HOME", "home"), ("TANDEM_MODELS", "store"),
                     ("TANDEM_HISTORY", "history"), ("TANDEM_PAIRS", "pairs"),
                     ("TANDEM_EVIDENCE", "evidence"), ("TANDEM_CALIBRATIONS", "calibrations")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    monkeypatch.setattr("loading.devices.detect", lambda: CPU_ONLY)
    # The fakes decode on a virtual clock: the machine's load does not bear on them.
    monkeypatch.setattr("engine.pair.machine_load", no_load)
    vocab = tinygguf.vocab(64)
    return (ModelConfig(str(tinygguf.write(tmp_path / "t.gguf", tokens=vocab)), n_ctx=256),
            ModelConfig(str(tinygguf.write(tmp_path / "d.gguf", tokens=vocab)), n_ctx=256))


def opened_counted(request: PairRequest):
    s = script(PATTERNS["high"], 0)
    clock = VirtualClock()
    made: list[Counted] = []

    def load(config: ModelConfig) -> Counted:
        made.append(Counted(s, clock, WIDE.draft if "d.gguf" in config.path else WIDE.verify))
        return made[-1]
    opened = open_pair(request, loader=load)
    opened.pair.clock = clock.now
    for fake in made:
        fake.widths.clear()  # the load's warm-up decodes
    return opened, made


def test_every_command_starts_from_the_calibrations_kept_for_its_files_and_settings(files):
    request = PairRequest(*files, LoadOptions(draft_quant="off"), say=opening.QUIET)
    opened, made = opened_counted(request)
    opened.pair.calibration("hybrid", 8)
    opened.pair.close()
    assert made[0].widths != []
    path = opened.calibrations.path if opened.calibrations else None
    assert path is not None and path.parent == calibrations_dir()
    assert path.name == f"{opened.pairing.key.id}.json" == calibrations_path(opened.pairing.key).name
    # The store owns its folder and names: private, beside the evidence, never in it.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(evidence_dir().glob("*")) or all(
        "calibration" not in p.read_text() for p in evidence_dir().glob("*.json"))
    assert [p.name for p in calibrations_dir().iterdir()] == [path.name]

    again, made = opened_counted(request)
    again.pair.calibration("hybrid", 8)
    again.pair.close()
    assert all(f.widths == [] for f in made)

    # Other threads are other settings: measured again, and `tandem calibrate`'s anew.
    fewer = replace(request, target=replace(files[0], n_threads=1))
    for other in (fewer, replace(request, remeasure=True)):
        third, made = opened_counted(other)
        third.pair.calibration("hybrid", 8)
        third.pair.close()
        assert made[0].widths != []


def test_the_store_keeps_a_folder_of_its_own_in_the_model_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.delenv("TANDEM_CALIBRATIONS")
    monkeypatch.delenv("TANDEM_EVIDENCE")
    assert calibrations_path(KEY) == tmp_path / "store" / "calibrations" / f"{KEY.id}.json"
    assert evidence_dir() != calibrations_dir()
