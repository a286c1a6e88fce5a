"""Stores that survive a kill (issue 38): a child process writes one store and is killed with
SIGKILL inside that write, at a chosen step of the one atomic write (models/atomic.py's
`on_step` seam, which the child alone sets): after the temporary file holds a chosen part of its
bytes (a kill at that byte: what a killed writer leaves is a prefix of what it meant to write),
after it is on disk, or after the rename. The next start (the store's own reader, in this
process) must find the old file (a kill before the rename) or the new one (after it), never a
torn one, and say nothing. Then the next write removes what the killed writers left behind.

Every kill lands inside a write by construction, so the test does not depend on timing or on
the machine's load (issue 43): a write that does not go through models/atomic.py is never killed,
and the test says so.

Stores: an assembled model file (models/embedded.py), a derived draft (loading/derived/files.py),
a pairing record (models/tuned.py), the history (loading/history.py), the controller's evidence
(loading/evidence.py), the calibrations (loading/calibrations.py). Each has five kills in the default run (every step; no byte, some, all)
and 50 at seeded random steps and bytes behind `long` (scripts/test --all). A negative control
writes in place without models/atomic.py: the same kill at a byte must find a torn file.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import numpy as np
import pytest

from loading.derived.files import derive, derived_path, file_sha256
from engine.control.evidence import Evidence
from engine.control.costs import Calibration
from loading.calibrations import CalibrationFile
from loading.evidence import EvidenceFile
from loading.history import HistoryStore
from models import atomic, embedded, tuned
from models.atomic import write_atomically
from models.candidate import Candidate
from models.tuned import Choice, PairingRecord, PairKey

FORK = multiprocessing.get_context("fork")
LONG_KILLS = 50


class Torn(AssertionError):
    """The reader found a file that is neither the old one nor the new one."""


@dataclass
class Store:
    """`write(ctx, i)` writes version i; `read(ctx)` is the next start's reader: the version it
    found (0: none yet), or Torn; `target(ctx)` is the file the store writes (a write may write
    other files first, a hash stamp for one)."""
    name: str
    setup: Callable[[Path], Any]
    write: Callable[[Any, int], None]
    read: Callable[[Any], int]
    target: Callable[[Any], Path]
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


def _model_target(ctx: Any) -> Path:
    return ctx[0].path


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


def _copy_in_blocks(source: Path, sha: str) -> Callable[[Path], None]:
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
        derive(source, "kill", _copy_in_blocks)
    else:
        write_atomically(out, _copy_in_blocks(source, ""))


def _derived_target(source: Any) -> Path:
    return derived_path(source, "kill", file_sha256(source))


def _derived_read(source: Any) -> int:
    out = derived_path(source, "kill", file_sha256(source))
    if not out.exists():
        return 0
    if out.read_bytes() != source.read_bytes():
        raise Torn(f"{out.name}: {out.stat().st_size} bytes, not the source's copy")
    return 1


# A pairing record ----------------------------------------------------------------------------

KEY = PairKey("a" * 64, "", "b" * 64)
NOTE = 5_000  # repeats of an 8-digit version in each note (40 KB)


def _record_setup(tmp: Path) -> Any:
    return None


def _record_write(_: Any, i: int) -> None:
    # Notes in every entry, so that a file cut short anywhere is not a record of one version.
    measured = {f"candidate-{j}": {"n": i, "note": f"{i:08d}" * NOTE} for j in range(8)}
    tuned.save(PairingRecord(key=KEY, target="t.gguf", draft="d.gguf", adapter="",
                             adapter_scale=1.0, chosen=Choice(Candidate("draft"), n_prompts=i),
                             measured=measured))


def _record_target(_: Any) -> Path:
    return tuned.pairs_dir() / f"{KEY.id}.json"


def _record_read(_: Any) -> int:
    record = tuned.find(KEY)
    if record is None:
        return 0
    i = record.chosen.n_prompts
    if len(record.measured) != 8 or any(m["n"] != i or m["note"] != f"{i:08d}" * NOTE
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


def _history_target(root: Any) -> Path:
    return HistoryStore("tok", capacity=HISTORY_BUDGET, root=root).path()


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
    kept = EvidenceFile(path, EVIDENCE_ID)
    kept.drafters = {d: Evidence(plain_ms=float(i), explored_ms=0.0, answers=i,
                                 pending={"note": f"{i:08d}" * NOTE})
                     for d in DRAFTERS}
    kept.save()


def _evidence_target(path: Any) -> Path:
    return path


def _evidence_read(path: Any) -> int:
    kept = EvidenceFile(path, EVIDENCE_ID)
    versions = {kept.for_drafter(d).answers for d in DRAFTERS}
    if len(versions) != 1:
        raise Torn(f"evidence mixes versions {sorted(versions)}")
    return versions.pop()


# The calibrations (loading/calibrations.py) ---------------------------------------------------

def _calibrations_setup(tmp: Path) -> Any:
    return tmp / "pair.calibrations.json"


def _calibrations_write(path: Any, i: int) -> None:
    CalibrationFile(path, EVIDENCE_ID).keep("draft", "d.gguf", Calibration.from_points(
        {w: float(i + w) for w in range(1, 400)}, {1: float(i)}))


def _calibrations_read(path: Any) -> int:
    found = CalibrationFile(path, EVIDENCE_ID).restore("draft", "d.gguf", 1)
    if found is None:
        return 0
    versions = {round(v - w) for w, v in enumerate(found.verify_ms, 1)} | {round(found.draft_ms[0])}
    if len(versions) != 1:
        raise Torn(f"calibrations mix versions {sorted(versions)}")
    return versions.pop()


# The negative control: the model file written in place ------------------------------------

def _in_place_write(ctx: Any, i: int) -> None:
    """The whole file written over the old one in place; the kill at a byte comes where an
    atomic write's would ("written"), with the real file as its own temporary file."""
    model, wheels = ctx
    with open(model.path, "wb") as f:
        for n, wheel in enumerate(wheels, start=1):
            with zipfile.ZipFile(wheel) as z:
                f.write(z.read(f"data/part{n:02d}.bin"))
    if atomic.on_step is not None:
        atomic.on_step("written", model.path, model.path)


STORES = [
    Store("model file", _model_setup, _model_write, _model_read, _model_target, ordered=False),
    Store("derived draft", _derived_setup, _derived_write, _derived_read, _derived_target,
          ordered=False),
    Store("pairing record", _record_setup, _record_write, _record_read, _record_target),
    Store("history", _history_setup, _history_write, _history_read, _history_target),
    Store("evidence", _evidence_setup, _evidence_write, _evidence_read, _evidence_target),
    Store("calibrations", _calibrations_setup, _calibrations_write, _calibrations_read,
          _evidence_target),
]
IN_PLACE = Store("model file written in place", _model_setup, _in_place_write, _model_read,
                 _model_target, ordered=False)


@dataclass(frozen=True)
class Kill:
    """Where a writer dies: at `step` of models/atomic.py's write (atomic.STEPS); at "written",
    with `fraction` of the temporary file's bytes written (0: none, 1: all)."""
    step: str
    fraction: float = 1.0

    def __str__(self) -> str:
        return f"{self.step} ({self.fraction:.0%} of the bytes)" if self.step == "written" \
            else self.step


# Every step; at "written": no byte, some, all.
DEFAULT_KILLS = [Kill("renamed"), Kill("written", 0.0), Kill("written", 0.37),
                 Kill("written", 1.0), Kill("synced")]


def random_kills(n: int, rng: random.Random) -> list[Kill]:
    return [Kill(step, rng.random() if step == "written" else 1.0)
            for step in (rng.choice(atomic.STEPS) for _ in range(n))]


def _kill_hook(kill: Kill, target: Path) -> Callable[[str, Path, Path], None]:
    def hook(step: str, tmp: Path, out: Path) -> None:
        if step != kill.step or out.name != target.name:
            return
        if step == "written":
            os.truncate(tmp, int(tmp.stat().st_size * kill.fraction))
        os.kill(os.getpid(), signal.SIGKILL)
    return hook


def _writer(store: Store, ctx: Any, version: int, kill: Kill) -> None:
    """Write `version`, dying at `kill` (the process exits normally only if the write never
    reached that step of models/atomic.py)."""
    _writing.clear()  # a new process reads the store from disk, not from the parent's memory
    atomic.on_step = _kill_hook(kill, store.target(ctx))
    store.write(ctx, version)


def _orphans(folder: Path, pid: int | None = None) -> list[Path]:
    """Temporary files models/atomic.py left (by process `pid`, or any)."""
    return [p for p in folder.rglob(".*.part") if pid is None or f".{pid}." in p.name]


def kill_writers(store: Store, ctx: Any, tmp: Path, kills: list[Kill]) -> int:
    """For each kill: a child writes the next version and dies there; the store is read as the
    next start would. Returns the last version found."""
    found = store.read(ctx)
    for kill in kills:
        child = FORK.Process(target=_writer, args=(store, ctx, found + 1, kill), daemon=True)
        child.start()
        child.join(300)  # only a guard against a hang
        assert child.exitcode == -signal.SIGKILL, \
            f"{store.name}: the writer was not killed at {kill} (exit {child.exitcode}): " \
            "did the write go through models/atomic.py?"
        before_rename = kill.step != "renamed"
        now = store.read(ctx)
        # A kill before the rename leaves the writer's temporary file; after it, none.
        assert bool(_orphans(tmp, child.pid)) == before_rename, (store.name, str(kill))
        if store.ordered:
            expected = found if before_rename else found + 1
            assert now == expected, f"{store.name}: killed at {kill}: version {now}, not {expected}"
        else:
            assert now == 1, f"{store.name}: killed at {kill}: the file is gone"
        found = now
    return found


@pytest.fixture
def stores_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TANDEM_PAIRS", str(tmp_path / "store" / "pairs"))
    return tmp_path


def _run(store: Store, tmp: Path, kills: list[Kill], capfd) -> None:
    ctx = store.setup(tmp)
    store.write(ctx, 1)  # the old file every kill must leave whole (or replace whole)
    found = kill_writers(store, ctx, tmp, kills)
    out, err = capfd.readouterr()
    with capfd.disabled():
        print(f"\n{store.name}: {len(kills)} kills inside a write, version {found} found last")
    assert "warning" not in err and "Traceback" not in err, err
    assert not list(tmp.rglob("*.corrupt-*"))
    # A write removes the temporary files of writers killed before it, so the last kill's is
    # left (unless it came after the rename).
    assert bool(_orphans(tmp)) == (kills[-1].step != "renamed")
    # The next write removes what the killed writers left, and the store reads back.
    store.write(ctx, found + 1)
    assert _orphans(tmp) == [] and store.read(ctx) >= 1


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.name)
def test_a_writer_killed_at_any_step_of_a_write_leaves_the_old_file_or_the_new_one(
        store, stores_env, capfd):
    _run(store, stores_env, DEFAULT_KILLS, capfd=capfd)


@pytest.mark.long
@pytest.mark.parametrize("store", STORES, ids=lambda s: s.name)
def test_fifty_kills_per_store(store, stores_env, capfd):
    _run(store, stores_env, random_kills(LONG_KILLS, random.Random(3800)), capfd=capfd)


@pytest.mark.parametrize("fraction", [0.0, 0.37, 0.99])
def test_the_kills_find_a_torn_file_when_the_writer_writes_in_place(fraction, stores_env):
    ctx = IN_PLACE.setup(stores_env)
    IN_PLACE.write(ctx, 1)
    with pytest.raises(Torn):
        kill_writers(IN_PLACE, ctx, stores_env, [Kill("written", fraction)])
