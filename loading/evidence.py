"""The pair's evidence on disk: what the adaptive controller learned of each drafter (acceptance
per source and match length, the exploration ledger: engine/control/evidence.py), kept in a
folder of its own, `evidence/<key id>.json` in the model store (`evidence_dir`;
`TANDEM_EVIDENCE` overrides it), so that a new process starts from it. No other store reads
that folder, and this one reads only the file of its pair: the pairing records in `pairs/` are
models/tuned.py's.

It is kept for one identity: the pair (the hashes of the target, adapter and draft files:
models/tuned.py's `PairKey`), the models as loaded (a requantized or trimmed draft is another
model), the machine and the build (the versions of tandem and llama-cpp-python). Evidence of
another identity is stale, as a pairing record of another target is: it is not read, and the
next save replaces it. An unreadable file is set aside with one warning line and counts as none;
the file is written atomically and user-only (models/atomic.py), like the history.

The generations of several slots (`tandem serve --parallel N`) share a drafter's evidence and
end at once: `save` holds the file's lock from the snapshot to the rename, so saves go one at a
time and the last holds what every answer before it learned (never an older snapshot renamed
over a newer one).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from engine.control.evidence import Evidence
from engine.pair import Pair
from models.atomic import set_aside, write_text
from models.tandem_store import store_dir, writable_dir
from models.tuned import PairKey


# How often a snapshot is taken before a concurrent change is let through as an error.
SNAPSHOT_TRIES = 8


def evidence_dir() -> Path:
    """`evidence/` in the model store; `TANDEM_EVIDENCE` overrides it (the test suite points it
    at an empty folder, as it does the pairing records')."""
    env = os.environ.get("TANDEM_EVIDENCE")
    return writable_dir(Path(env) if env else store_dir() / "evidence")


def evidence_path(key: PairKey) -> Path:
    """Where the evidence of the pair `key` is kept: `evidence/<key id>.json`."""
    return evidence_dir() / f"{key.id}.json"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _cpu() -> str:
    """The CPU's kind: a hash of its model and flag lines (Linux), else what platform says."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor()
    kind = sorted({line for line in text.splitlines() if line.startswith(("model name", "flags"))})
    return hashlib.sha256("\n".join(kind).encode()).hexdigest()[:16]


def identity(key: PairKey, pair: Pair) -> dict:
    """What evidence is kept for: the pair, its models as loaded, the machine, the build."""
    draft = pair.draft_backend.name if pair.draft_backend is not None else ""
    return {"pair": key.id, "models": [pair.target.backend.name, draft],
            "machine": f"{platform.system()} {platform.machine()}, {_cpu()}, "
                       f"{os.cpu_count()} CPUs",
            "build": f"tandem {_version('tandem')}, llama-cpp-python "
                     f"{_version('llama_cpp_python')}"}


class EvidenceFile:
    """One pair's evidence file: `for_drafter(drafter)` restores a drafter's (or starts it
    afresh), kept by `save`, which writes every drafter's back, atomically (those this
    process never used as the file held them)."""

    def __init__(self, path: Path, ident: dict) -> None:
        self.path = path
        self.identity = ident
        self.drafters: dict[str, Evidence] = {}
        self._stored: dict = {}
        self._lock = threading.Lock()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return
        try:
            stored = json.loads(text)
            if not isinstance(stored, dict) or not isinstance(stored.get("drafters", {}), dict):
                raise ValueError("not an evidence file")
        except ValueError as exc:
            set_aside(path, "the evidence file", exc)
            return
        if stored.get("identity") == ident:
            self._stored = dict(stored.get("drafters") or {})

    def for_drafter(self, drafter: str) -> Evidence:
        """The evidence of `drafter`, the same each time: restored from the file when it holds
        some of this identity, else fresh; either way kept by `save`."""
        with self._lock:
            found = self.drafters.get(drafter)
            if found is None:
                try:
                    found = Evidence.restore(self._stored.get(drafter), keeper=self.save)
                except (KeyError, TypeError, ValueError):
                    found = Evidence(keeper=self.save)
                self.drafters[drafter] = found
            return found

    def save(self, _: Evidence | None = None) -> None:
        with self._lock:
            # The drafters this process has not used keep what the file held for them.
            drafters = {**self._stored, **self._snapshot()}
            text = json.dumps({"identity": self.identity, "drafters": drafters})
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text(self.path, text, private=True)
            except OSError:
                # A store that cannot be written costs the evidence of this answer, not the
                # answer.
                pass

    def _snapshot(self) -> dict:
        """Every drafter's evidence as it is now. Another slot's generation may be adding to
        one (a new acceptance key) meanwhile, outside this lock: a copy that meets that is
        taken again."""
        for _ in range(SNAPSHOT_TRIES - 1):
            try:
                return {k: v.as_dict() for k, v in self.drafters.items()}
            except RuntimeError:  # a dict changed size while it was copied
                continue
        return {k: v.as_dict() for k, v in self.drafters.items()}


def keep_evidence(pair: Pair, key: PairKey) -> EvidenceFile:
    """Let `pair`'s drafters start from the evidence kept for it on disk, and keep what they
    learn there after every answer."""
    kept = EvidenceFile(evidence_path(key), identity(key, pair))
    pair.knowledge.restore_evidence_from(kept.for_drafter)
    return kept
