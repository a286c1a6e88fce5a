"""The controller's evidence outlives an answer: in the process (the pair keeps it beside the
drafter's calibration, engine/knowledge.py), and on disk in a folder of its own
(loading/evidence.py), for one pair, machine and build only."""
from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from engine.control.costs import Calibration
from engine.control.evidence import Evidence
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import COPY_MAX, GenerationConfig
from engine.sampling import SamplingParams
from bench.fakes.costed import PATTERNS, script, scripted_pair
from tests.fakes.flat_costs import FLAT
from loading.evidence import EvidenceFile, evidence_path, identity, keep_evidence
from models.tuned import PairKey

KEY = PairKey("a" * 64, "", "b" * 64)
GREEDY = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=24)


def answer(pair, prompt: str) -> list:
    events = list(pair.generate(prompt, GREEDY, raw=True))
    assert isinstance(events[-1], DoneEvent)
    return [e.round for e in events if isinstance(e, RoundEvent)]


def test_answers_of_one_pair_share_their_evidence_in_the_process():
    s = script(PATTERNS["high"], 0)
    pair, _ = scripted_pair(FLAT, s)
    answer(pair, s.prompt_text)
    evidence = pair.knowledge.evidence_of("hybrid")
    assert evidence.answers == 1 and evidence.plain_ms > 0
    counts = evidence.estimator.keys
    drafted = sum(c.rounds for c in counts.values())
    answer(pair, s.prompt_text)
    assert pair.knowledge.evidence_of("hybrid") is evidence and evidence.answers == 2
    assert sum(c.rounds for c in evidence.estimator.keys.values()) > drafted


def test_evidence_is_kept_on_disk_for_its_pair_machine_and_build_only():
    s = script(PATTERNS["high"], 0)
    pair, _ = scripted_pair(FLAT, s)
    kept = keep_evidence(pair, KEY)
    rounds = answer(pair, s.prompt_text)
    assert any(r.drafted for r in rounds)
    path = evidence_path(KEY)
    stored = json.loads(path.read_text())
    assert stored["identity"] == identity(KEY, pair) and "hybrid" in stored["drafters"]
    learned = kept.drafters["hybrid"].estimator.as_dict()

    # A new process: the same pair starts from it.
    again, _ = scripted_pair(FLAT, s)
    keep_evidence(again, KEY)
    restored = again.knowledge.evidence_of("hybrid")
    assert restored.adopt(kept.drafters["hybrid"].estimator.constants)
    assert restored.estimator.as_dict() == learned
    assert restored.plain_ms == kept.drafters["hybrid"].plain_ms

    # Another machine's (or build's, or models') evidence is stale: not read.
    stored["identity"]["machine"] = "another machine"
    path.write_text(json.dumps(stored))
    other = EvidenceFile(path, identity(KEY, pair)).for_drafter("hybrid")
    assert other.plain_ms == 0 and other.pending == {}
    # An unreadable file counts as none.
    path.write_text("{not json")
    assert EvidenceFile(path, identity(KEY, pair)).for_drafter("hybrid").plain_ms == 0


def test_a_save_keeps_the_evidence_of_drafters_this_process_did_not_use(tmp_path):
    """A process that answers with one drafter keeps the others' evidence an earlier process
    left (the kill-and-restart test saw the file's answers go back: tests/test_serve_kills.py)."""
    path, ident = tmp_path / "pair.json", {"pair": "p"}
    first = EvidenceFile(path, ident)
    for drafter, answers in (("hybrid", 3), ("lookup", 2)):
        first.for_drafter(drafter).answers = answers
    first.save()
    second = EvidenceFile(path, ident)
    second.for_drafter("lookup").answers += 1
    second.save()
    stored = json.loads(path.read_text())["drafters"]
    assert {d: e["answers"] for d, e in stored.items()} == {"hybrid": 3, "lookup": 3}
    assert EvidenceFile(path, ident).for_drafter("hybrid").answers == 3


def test_evidence_of_another_format_is_refused():
    ev = Evidence(plain_ms=5.0)
    assert Evidence.restore(ev.as_dict()).plain_ms == 5.0
    for bad in (None, {}, {**ev.as_dict(), "format": 99}):
        try:
            Evidence.restore(bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"restored {bad!r}")


def test_a_calibration_is_a_value_and_the_pair_keeps_the_evidence_beside_it():
    cal = Calibration([1.0, 2.0], [10.0, 11.0], "draft-model")
    assert cal == Calibration((1.0, 2.0), (10.0, 11.0), "draft-model") and hash(cal)
    with pytest.raises(FrozenInstanceError):
        cal.verify_ms = (1.0,)  # type: ignore[misc]
    s = script(PATTERNS["high"], 0)
    pair, _ = scripted_pair(FLAT, s)
    answer(pair, s.prompt_text)
    evidence = pair.knowledge.evidence_of("hybrid")
    # A wider calibration leaves the evidence; a drafter offered anew starts both over.
    narrow = pair.calibration("hybrid", 4)
    assert pair.calibration("hybrid", COPY_MAX + 4) is not narrow
    assert pair.knowledge.evidence_of("hybrid") is evidence
    pair.knowledge.forget("hybrid")
    assert "hybrid" not in pair.knowledge
    assert pair.knowledge.evidence_of("hybrid") is not evidence


def test_evidence_restored_from_a_source_is_kept_by_the_keeper_it_was_made_with():
    kept: list[Evidence] = []
    s = script(PATTERNS["high"], 0)
    pair, _ = scripted_pair(FLAT, s)
    pair.knowledge.restore_evidence_from(lambda name: Evidence(keeper=kept.append))
    answer(pair, s.prompt_text)
    answer(pair, s.prompt_text)
    assert kept == [pair.knowledge.evidence_of("hybrid")] * 2
