"""Stores that survive a kill (issue 38): a child process writes one store over and over and is
killed with SIGKILL at a random moment; the next start (the store's own reader, in this process)
must find the old file or the new one, never a torn one, and say nothing. Then the next write
removes what the killed writer left behind.

Stores: an assembled model file (models/embedded.py), a derived draft (loading/derived/files.py),
a pairing record (models/tuned.py), the history (loading/history.py). Each has a few kills in the
default run and 50 behind `long` (scripts/test --all): 200 in all. A negative control writes in
place without models/atomic.py: the same kills must find a torn file.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import numpy as np
import pytest

from loading.derived.files import derive, derived_path, file_sha256
from engine.control.evidence import Evidence
from loading.evidence import EvidenceFile
from loading.history import HistoryStore
from models import embedded, tuned
from models.tandem_store import write_atomically
from models.candidate import Candidate
from models.tuned import Choice, PairingRecord, PairKey

FORK = multiprocessing.get_context("fork")
DEFAULT_KILLS = 3
LONG_KILLS = 50


class Torn(AssertionError):
    """The reader found a file that is neither the old one nor the new one."""


@dataclass
class Store:
    """`write(ctx, i)` writes version i; `read(ctx)` is the next start's reader: the version it
    found (0: none yet), or Torn."""
    name: str
    setup: Callable[[Path], Any]
    write: Callable[[Any, int], None]
    read: Callable[[Any], int]
    # Whether versions only grow (the child resumes from the last one found).
    ordered: bool = True


# An assembled model file ---------------------------------------------------------------------

def _model_setup(tmp: Path) -> Any:
    parts = [bytes(random.Random(i).randbytes(1 << 20)) for i in range(3)]
    wheels = []
    for i, data in enumerate(parts, start=1):
        wheel = tmp / f"k_part{i}-1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"data/part{i:02d}.bin", data)
        wheels.append(wheel)
    whole = b"".join(parts)
    model = embedded.EmbeddedModel(role="draft", filename="m.gguf", package_prefix="k-part",
                                   version="1", n_parts=3, size=len(whole),
                                   sha256=hashlib.sha256(whole).hexdigest())
    return model, wheels


def _model_write(ctx: Any, i: int) -> None:
    # Over the file a previous write left: a kill must leave that one whole.
    model, wheels = ctx
    with mock.patch.object(embedded, "_wheels", return_value=wheels):
        embedded.assemble(model)


def _model_read(ctx: Any) -> int:
    model, _ = ctx
    if not model.path.exists():
        return 0
    if not embedded.is_intact(model):
        raise Torn(f"{model.path.name}: {model.path.stat().st_size} of {model.size} bytes")
    return 1


# A derived draft -----------------------------------------------------------------------------

def _derived_setup(tmp: Path) -> Any:
    source = tmp / "draft.gguf"
    source.write_bytes(random.Random(7).randbytes(3 << 20))
    file_sha256(source)  # the hash sidecar, as a first load leaves it
    return source


def _copy_slowly(source: Path, sha: str) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        data = source.read_bytes()
        with open(tmp, "wb") as f:
            for at in range(0, len(data), 1 << 16):
                f.write(data[at:at + (1 << 16)])
                f.flush()
    return write


def _derived_write(source: Any, i: int) -> None:
    # The first build through `derive`; later ones rebuild over it with derive's own writer
    # (`derive` returns a current file without writing).
    out = derived_path(source, "kill", file_sha256(source))
    if not out.exists():
        derive(source, "kill", _copy_slowly)
    else:
        write_atomically(out, _copy_slowly(source, ""))


def _derived_read(source: Any) -> int:
    out = derived_path(source, "kill", file_sha256(source))
    if not out.exists():
        return 0
    if out.read_bytes() != source.read_bytes():
        raise Torn(f"{out.name}: {out.stat().st_size} bytes, not the source's copy")
    return 1


# A pairing record ----------------------------------------------------------------------------

KEY = PairKey("a" * 64, "", "b" * 64)


def _record_setup(tmp: Path) -> Any:
    return None


def _record_write(_: Any, i: int) -> None:
    # Long notes, so that writing, not building the text, takes most of the time.
    measured = {f"candidate-{j}": {"n": i, "note": f"{i:08d}" * 50_000} for j in range(8)}
    tuned.save(PairingRecord(key=KEY, target="t.gguf", draft="d.gguf", adapter="",
                             adapter_scale=1.0, chosen=Choice(Candidate("draft"), n_prompts=i),
                             measured=measured))


def _record_read(_: Any) -> int:
    record = tuned.find(KEY)
    if record is None:
        return 0
    i = record.chosen.n_prompts
    if len(record.measured) != 8 or any(m["n"] != i or m["note"] != f"{i:08d}" * 50_000
                                        for m in record.measured.values()):
        raise Torn(f"pairing record of version {i} mixes versions")
    return i


# The history ---------------------------------------------------------------------------------

# Documents of 5,000 tokens in a budget of 25,000: a file of about five, the oldest evicted,
# so every write is the same size however many kills came before.
HISTORY_BUDGET = 25_000


def _doc(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 150_000, 5_000)


def _history_setup(tmp: Path) -> Any:
    return tmp / "history"


_writing: dict[Path, HistoryStore] = {}


def _history_write(root: Any, i: int) -> None:
    # A writer reads the history once and keeps it, as a server does.
    store = _writing.setdefault(root, HistoryStore("tok", capacity=HISTORY_BUDGET, root=root))
    index = store.index()
    while index.clock < i:
        index.add(_doc(index.clock + 1))
    store.save()


def _history_read(root: Any) -> int:
    """The version is the index's clock (one tick per document added): its last document must
    be that version's."""
    index = HistoryStore("tok", capacity=HISTORY_BUDGET, root=root).index()
    if index.n_documents and not np.array_equal(index.tokens[index.starts[-1]:-1],
                                                _doc(index.clock)):
        raise Torn(f"history at clock {index.clock} ends with another document")
    return index.clock


# The controller's evidence (loading/evidence.py) ---------------------------------------------

EVIDENCE_ID = {"pair": "kill", "models": ["t.gguf", "d.gguf"], "machine": "m", "build": "b"}
DRAFTERS = [f"drafter-{j}" for j in range(8)]


def _evidence_setup(tmp: Path) -> Any:
    return tmp / "pair.evidence.json"


def _evidence_write(path: Any, i: int) -> None:
    # Long notes, so that writing, not building the text, takes most of the time.
    kept = EvidenceFile(path, EVIDENCE_ID)
    kept.drafters = {d: Evidence(plain_ms=float(i), explored_ms=0.0, answers=i,
                                 pending={"note": f"{i:08d}" * 50_000})
                     for d in DRAFTERS}
    kept.save()


def _evidence_read(path: Any) -> int:
    kept = EvidenceFile(path, EVIDENCE_ID)
    versions = {kept.for_drafter(d).answers for d in DRAFTERS}
    if len(versions) != 1:
        raise Torn(f"evidence mixes versions {sorted(versions)}")
    return versions.pop()


# The negative control: the model file written in place ------------------------------------

def _in_place_write(ctx: Any, i: int) -> None:
    model, wheels = ctx
    with open(model.path, "wb") as f:
        for n, wheel in enumerate(wheels, start=1):
            with zipfile.ZipFile(wheel) as z:
                f.write(z.read(f"data/part{n:02d}.bin"))
                f.flush()


STORES = [
    Store("model file", _model_setup, _model_write, _model_read, ordered=False),
    Store("derived draft", _derived_setup, _derived_write, _derived_read, ordered=False),
    Store("pairing record", _record_setup, _record_write, _record_read),
    Store("history", _history_setup, _history_write, _history_read),
    Store("evidence", _evidence_setup, _evidence_write, _evidence_read),
]
IN_PLACE = Store("model file written in place", _model_setup, _in_place_write, _model_read,
                 ordered=False)


def _writer(store: Store, ctx: Any, start: int, ready: Any) -> None:
    """Write versions start, start + 1, ... until killed; `ready` after the first (whose time
    is mostly the start of a process: reading the store)."""
    _writing.clear()  # a new process reads the store from disk, not from the parent's memory
    i = start
    while True:
        store.write(ctx, i)
        ready.set()
        i += 1


def _orphans(folder: Path, pid: int | None = None) -> list[Path]:
    """Temporary files models/atomic.py left (by process `pid`, or any)."""
    return [p for p in folder.rglob(".*.part") if pid is None or f".{pid}." in p.name]


def kill_writers(store: Store, ctx: Any, tmp: Path, kills: int, rng: random.Random,
                 window: float) -> dict[str, int]:
    """Start a writer, kill it at a random moment within `window` seconds, and read the store
    as the next start would; until `kills` kills have landed inside a write (the writer left a
    temporary file), at most 10 * `kills` tries. Returns the last version found and the counts."""
    found = store.read(ctx)
    tries = mid_write = 0
    while mid_write < kills and tries < 10 * kills:
        tries += 1
        ready = FORK.Event()
        child = FORK.Process(target=_writer, args=(store, ctx, found + 1, ready), daemon=True)
        child.start()
        assert ready.wait(30)
        time.sleep(rng.uniform(0.0, window))
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        assert child.exitcode == -signal.SIGKILL
        mid_write += bool(_orphans(tmp, child.pid))
        now = store.read(ctx)
        if store.ordered:
            assert now >= found, f"{store.name}: went back from version {found} to {now}"
        found = now
    return {"found": found, "kills": tries, "mid_write": mid_write}


def _window(store: Store, ctx: Any) -> float:
    """How long a kill may wait: about five writes (50 ms at least)."""
    store.write(ctx, store.read(ctx) + 1)
    t0 = time.perf_counter()
    store.write(ctx, store.read(ctx) + 1)
    return max(0.05, 5 * (time.perf_counter() - t0))


@pytest.fixture
def stores_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TANDEM_PAIRS", str(tmp_path / "store" / "pairs"))
    return tmp_path


def _run(store: Store, tmp: Path, kills: int, seed: int, capfd) -> None:
    ctx = store.setup(tmp)
    window = _window(store, ctx)
    got = kill_writers(store, ctx, tmp, kills, random.Random(seed), window)
    out, err = capfd.readouterr()
    with capfd.disabled():
        print(f"\n{store.name}: {got['kills']} kills, {got['mid_write']} inside a write, "
              f"version {got['found']} found last")
    assert "warning" not in err and "Traceback" not in err, err
    assert not list(tmp.rglob("*.corrupt-*"))
    # The kills landed inside writes (a temporary file was left), not only between them.
    assert got["mid_write"] == kills, got
    # The next write removes what the killed writers left, and the store reads back.
    store.write(ctx, got["found"] + 1)
    assert _orphans(tmp) == [] and store.read(ctx) >= 1


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.name)
def test_a_writer_killed_at_random_leaves_the_old_file_or_the_new_one(store, stores_env, capfd):
    _run(store, stores_env, DEFAULT_KILLS, seed=38, capfd=capfd)


@pytest.mark.long
@pytest.mark.parametrize("store", STORES, ids=lambda s: s.name)
def test_fifty_kills_per_store(store, stores_env, capfd):
    _run(store, stores_env, LONG_KILLS, seed=3800, capfd=capfd)


def test_the_kills_find_a_torn_file_when_the_writer_writes_in_place(stores_env, capfd):
    ctx = IN_PLACE.setup(stores_env)
    window = _window(IN_PLACE, ctx)
    with pytest.raises(Torn):
        kill_writers(IN_PLACE, ctx, stores_env, 6, random.Random(38), window)
