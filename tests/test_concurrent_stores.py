"""Stores that several slots write at once (`tandem serve --parallel 4`): the history of one API
key (loading/history.py) and the pair's evidence (loading/evidence.py). Four concurrent answers
on one key leave each store as a serial run leaves it: the history the same documents (in the
order the answers ended, which concurrency may change), the evidence of the same answers, and
each file the same as the store in memory. A save held mid-write while another saves shows the
lock: the file ends with the newer snapshot, never the older renamed over it."""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import models.atomic as atomic
from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from bench.fakes.backend import FakeBackend
from engine.control.costs import Calibration
from engine.control.evidence import Evidence
from engine.pair import Pair
from loading.calibrations import CalibrationFile
from loading.evidence import EvidenceFile, keep_evidence
from loading.history import HistoryStore, owner_for_key
from models.tuned import PairKey
from tests.serve_fakes import N_CTX, serve_access
from tests.test_batch import join_in_turn

KEY = PairKey("c" * 64, "", "d" * 64)
ALICE = owner_for_key("alice")
PROMPTS = ["def add(a, b): return a + b", "the second prompt", "a third, longer prompt here",
           "four"]
# Different lengths, so the answers end at different steps and save one after another.
MAX_TOKENS = [6, 12, 18, 24]
# How long a held save waits for another to be renamed first: with the lock none can be, and
# the save goes on when this passes (it bounds the test's wait; nothing asserts on time).
HOLD_S = 2.0


def documents(state: dict) -> list[tuple[int, ...]]:
    tokens, starts = state["tokens"], state["starts"]
    ends = np.append(starts[1:], len(tokens))
    return [tuple(tokens[s:e - 1].tolist()) for s, e in zip(starts, ends)]


def run(tmp: Path, parallel: int) -> dict:
    """The four answers on key alice, all at once (parallel 4) or one after another."""
    n_seq = parallel + 1 if parallel > 1 else 1
    pair = Pair(FakeBackend(seed=1, n_ctx=N_CTX, n_seq=n_seq),
                FakeBackend(seed=1, noise=0.5, n_ctx=N_CTX, n_seq=n_seq), parallel=parallel)
    kept = keep_evidence(pair, KEY)
    holder = PairHolder(pair, queue=GenerationQueue(4))
    holder.history = HistoryStore("tok", capacity=100_000, root=tmp)
    client = TestClient(create_app(holder, holder.queue, serve_access(None)),
                        headers={"Authorization": "Bearer alice"})
    texts: list = [None] * len(PROMPTS)

    def ask(i: int) -> None:
        r = client.post("/v1/completions", json={"prompt": PROMPTS[i], "temperature": 0,
                                                 "max_tokens": MAX_TOKENS[i]})
        assert r.status_code == 200, r.text
        texts[i] = r.json()["choices"][0]["text"]

    # Calibration first, on another key (the adaptive policy measures the pair once).
    assert client.post("/v1/completions", json={"prompt": "warm", "max_tokens": 2},
                       headers={"Authorization": "Bearer bob"}).status_code == 200
    if parallel > 1:
        assert pair.slots is not None
        join_in_turn(pair.slots.step, [lambda i=i: ask(i) for i in range(len(PROMPTS))])
        widths = [len(b) for b in pair.target.backend.batches]
        assert max(widths) == len(PROMPTS)  # the four ran in one batch
    else:
        for i in range(len(PROMPTS)):
            ask(i)
    on_disk = HistoryStore("tok", capacity=100_000, root=tmp).index(ALICE).state()
    stored = json.loads(kept.path.read_text())
    kept.path.unlink()
    return {"texts": texts, "memory": documents(holder.history.index(ALICE).state()),
            "disk": documents(on_disk), "evidence": stored["drafters"],
            "evidence_memory": {k: v.as_dict() for k, v in kept.drafters.items()}}


def test_four_concurrent_answers_on_one_key_leave_each_store_as_a_serial_run(tmp_path):
    serial, concurrent = run(tmp_path / "serial", 1), run(tmp_path / "concurrent", 4)
    assert concurrent["texts"] == serial["texts"] and all(serial["texts"])
    # The history: the same four documents (prompt and answer), on disk as in memory.
    assert len(serial["disk"]) == 4 and serial["disk"] == serial["memory"]
    assert Counter(concurrent["disk"]) == Counter(serial["disk"])
    assert concurrent["disk"] == concurrent["memory"]
    # The evidence: every answer counted, the file what the process holds.
    for run_ in (serial, concurrent):
        assert run_["evidence"] and run_["evidence"] == json.loads(
            json.dumps(run_["evidence_memory"]))
        assert sum(d["answers"] for d in run_["evidence"].values()) == 5  # with the warm-up
    assert {k: d["answers"] for k, d in concurrent["evidence"].items()} == \
        {k: d["answers"] for k, d in serial["evidence"].items()}


class HeldWrite:
    """models/atomic.py's step hook: the first write of a file waits, its temporary file
    written, until another write of it has been renamed (or HOLD_S passes)."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.renamed = threading.Event()
        self._first = True
        self._lock = threading.Lock()

    def __call__(self, step: str, tmp: Path, out: Path) -> None:
        if step == "written":
            with self._lock:
                first, self._first = self._first, False
            if first:
                self.held.set()
                self.renamed.wait(HOLD_S)
        elif step == "renamed" and self.held.is_set():
            self.renamed.set()


def interleaved(monkeypatch, change, save) -> None:
    """change(0); save in one thread, held mid-write; then change(1); save in another."""
    hook = HeldWrite()
    monkeypatch.setattr(atomic, "on_step", hook)
    change(0)
    first = threading.Thread(target=save)
    first.start()
    assert hook.held.wait(30)
    change(1)
    second = threading.Thread(target=save)
    second.start()
    first.join()
    second.join()


def test_a_history_save_held_mid_write_is_not_renamed_over_a_newer_one(tmp_path, monkeypatch):
    store = HistoryStore("tok", capacity=10_000, root=tmp_path)
    index = store.index(ALICE)
    interleaved(monkeypatch, lambda i: index.add([10 + i, 11, 12, 13]), lambda: store.save(ALICE))
    again = HistoryStore("tok", capacity=10_000, root=tmp_path).index(ALICE)
    assert documents(again.state()) == [(10, 11, 12, 13), (11, 11, 12, 13)]


def test_an_evidence_save_held_mid_write_is_not_renamed_over_a_newer_one(tmp_path, monkeypatch):
    kept = EvidenceFile(tmp_path / "e.json", {"pair": "x"})
    evidence: list[Evidence] = []
    interleaved(monkeypatch, lambda i: evidence.append(kept.for_drafter(f"d{i}")), kept.save)
    assert sorted(json.loads((tmp_path / "e.json").read_text())["drafters"]) == ["d0", "d1"]


def test_two_calibrations_kept_at_once_are_both_in_the_file(tmp_path, monkeypatch):
    """Two drafters calibrated together: the first keep held mid-write while the second keeps;
    the file ends with both (without the store's lock the second reads the file before the
    first is renamed, and the first is renamed over it: one calibration lost)."""
    kept = CalibrationFile(tmp_path / "c.json", {"pair": "x"})
    made = Calibration.from_points({1: 10.0, 2: 15.0}, {1: 2.0, 2: 2.0}, model_name="m")
    names = iter(["d0", "d1"])
    interleaved(monkeypatch, lambda i: None, lambda: kept.keep(next(names), "m", made))
    assert sorted(json.loads((tmp_path / "c.json").read_text())["drafters"]) == ["d0", "d1"]


@pytest.mark.parametrize("store", ["history", "evidence"])
def test_saves_from_many_threads_leave_the_file_as_the_store(tmp_path, store):
    """Eight threads, each adding and saving at once: the file holds all eight."""
    if store == "history":
        history = HistoryStore("tok", capacity=10_000, root=tmp_path)
        index = history.index(ALICE)

        def work(i: int) -> None:
            index.add([100 + i, 1, 2, 3])
            history.save(ALICE)
    else:
        kept = EvidenceFile(tmp_path / "e.json", {"pair": "x"})

        def work(i: int) -> None:
            kept.for_drafter(f"d{i}")
            kept.save()
    barrier = threading.Barrier(8)
    threads = [threading.Thread(target=lambda i=i: (barrier.wait(), work(i))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if store == "history":
        got = documents(HistoryStore("tok", capacity=10_000, root=tmp_path).index(ALICE).state())
        assert sorted(d[0] for d in got) == list(range(100, 108))
    else:
        assert len(json.loads((tmp_path / "e.json").read_text())["drafters"]) == 8
