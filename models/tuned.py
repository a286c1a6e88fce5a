"""Pairing records: what `tandem tune` chose for one target (+ adapter) and draft, kept in the
model store under `pairs/`, one JSON file per key: `<key id>.json` (`record_path`). Only names of
that form are read as records (an id has no dot), so no other file in the folder is ever taken
for one: older versions kept the controller's evidence here as `<id>.evidence.json`, which now
has a folder of its own (loading/evidence.py).

The key is the SHA-256 of the target file, of its LoRA adapter (if any) and of the draft file
(empty when tuned without a draft), so a record applies only to those exact files; a record for
the same draft with another target or adapter hash means the draft was tuned for another version
of the target (`stale_for`). The caller hashes the files (app/runtime/tuned.py `key_for`, with
the store's cached hasher).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from models.atomic import set_aside, write_atomically
from models.candidate import Candidate
from models.tandem_store import store_dir, store_errors, writable_dir

RECORD_VERSION = 1
# A record's file name is its key's id and this.
SUFFIX = ".json"
# Plain decoding's drafter name (engine/drafters/base.py; models imports no engine module).
PLAIN = "plain"
_CANDIDATE_FIELDS = tuple(f.name for f in fields(Candidate))


@dataclass(frozen=True)
class PairKey:
    target_sha256: str
    adapter_sha256: str
    draft_sha256: str

    @property
    def id(self) -> str:
        """The record's file name stem: the target's hash head, then a hash of the whole key."""
        whole = "|".join((self.target_sha256, self.adapter_sha256, self.draft_sha256))
        return f"{self.target_sha256[:12]}-{hashlib.sha256(whole.encode()).hexdigest()[:16]}"


@dataclass
class Choice:
    """One tuned configuration (`candidate`: the drafter, the draft file variant and the policy),
    with what it measured against plain decoding on the tuning prompts."""
    candidate: Candidate
    acceptance: float = 0.0
    speedup_median: float = 1.0
    speedup_p10: float = 1.0
    n_prompts: int = 0

    def as_dict(self) -> dict:
        """As the record keeps it: the candidate's fields beside the figures, one flat object
        (the format every version of the record reads)."""
        d = asdict(self)
        return {**d.pop("candidate"), **d}

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        d = dict(d)
        c = {k: d.pop(k) for k in _CANDIDATE_FIELDS if k in d}
        # Records written before plain decoding's drafter was named "plain" say "none".
        if c.get("drafter") == "none":
            c["drafter"] = PLAIN
        return cls(Candidate(**c), **d)

    @property
    def label(self) -> str:
        c = self.candidate
        if c.drafter == PLAIN:
            return "plain decoding"
        parts = [c.drafter]
        if c.drafter in ("draft", "hybrid"):
            if c.draft_quant not in ("off", "auto"):
                parts.append(c.draft_quant)
            if c.draft_vocab != "full":
                parts.append(f"vocab-{c.draft_vocab}")
        if c.early_exit_layers is not None:
            parts.append(f"{c.early_exit_layers} layers")
        return " ".join(parts) + f" {c.policy} g={c.gamma}"


@dataclass(frozen=True)
class AdaptedDraft:
    """The draft adapted to this pair by `tandem adapt` (loading/derived/adapted.py): its file in
    the store's `derived/`, the hashes it was made from, and whether it beat the base draft on
    held-out prompts (`wins`, with the `reason` line and the proof's `table`). It is used only
    while it `applies_to` the record's key: another target, adapter or draft retires it."""
    file: str
    target_sha256: str
    adapter_sha256: str
    draft_sha256: str
    data_sha256: str
    train: str
    wins: bool
    reason: str
    table: tuple[str, ...] = ()

    def applies_to(self, key: "PairKey") -> bool:
        return (self.target_sha256, self.adapter_sha256, self.draft_sha256) == (
            key.target_sha256, key.adapter_sha256, key.draft_sha256)

    @property
    def path(self) -> Path:
        return store_dir() / "derived" / self.file

    @classmethod
    def from_dict(cls, d: dict) -> "AdaptedDraft":
        return cls(**{**d, "table": tuple(d.get("table", ()))})


@dataclass
class PairingRecord:
    key: PairKey
    target: str
    draft: str
    adapter: str
    adapter_scale: float
    # The configuration used by default (the best over every prompt), and per category.
    chosen: Choice
    by_category: dict[str, Choice] = field(default_factory=dict)
    # Every candidate measured, by name (`Candidate.name`): acceptance pooled and
    # lowest over categories, speedup median and p10, prompts, and why it stopped early.
    measured: dict[str, dict] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)
    date: str = ""
    tandem_version: str = ""
    version: int = RECORD_VERSION
    # The draft adapted to this pair (`tandem adapt`), if one was made.
    adapted: AdaptedDraft | None = None

    def as_dict(self) -> dict:
        return {**asdict(self), "chosen": self.chosen.as_dict(),
                "by_category": {k: c.as_dict() for k, c in self.by_category.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "PairingRecord":
        return cls(key=PairKey(**d["key"]), target=d["target"], draft=d["draft"],
                   adapter=d.get("adapter", ""), adapter_scale=float(d.get("adapter_scale", 1.0)),
                   chosen=Choice.from_dict(d["chosen"]),
                   by_category={k: Choice.from_dict(v) for k, v in d.get("by_category", {}).items()},
                   measured=d.get("measured", {}),
                   machine=d.get("machine", {}), sampling=d.get("sampling", {}),
                   date=d.get("date", ""), tandem_version=d.get("tandem_version", ""),
                   version=int(d.get("version", RECORD_VERSION)),
                   adapted=AdaptedDraft.from_dict(d["adapted"]) if d.get("adapted") else None)


def pairs_dir() -> Path:
    """`pairs/` in the model store; `TANDEM_PAIRS` overrides it (the test suite points it at an
    empty folder, so records tuned on the machine do not steer its generations)."""
    env = os.environ.get("TANDEM_PAIRS")
    return writable_dir(Path(env) if env else store_dir() / "pairs")


def record_path(key: PairKey) -> Path:
    """Where the record of `key` is kept: `pairs/<key id>.json`."""
    return pairs_dir() / f"{key.id}{SUFFIX}"


def is_record_name(name: str) -> bool:
    """Whether a file in `pairs/` is named as a record is (`record_path`): an id without a dot,
    then `.json`. Temporary files (a leading dot), set-aside ones (`.corrupt-<time>` after the
    suffix) and any other store's `<id>.<what>.json` are not."""
    stem = name[:-len(SUFFIX)]
    return name.endswith(SUFFIX) and bool(stem) and "." not in stem


def record_paths() -> list[Path]:
    """Every file in `pairs/` named as a record, sorted by name."""
    return sorted(p for p in pairs_dir().glob(f"*{SUFFIX}") if is_record_name(p.name))


def save(record: PairingRecord) -> Path:
    record.date = record.date or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    text = json.dumps(record.as_dict(), indent=2)
    out = record_path(record.key)
    with store_errors(out):
        return write_atomically(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _read(path: Path) -> PairingRecord | None:
    """The record in `path`; one that cannot be read is set aside with a warning line (tune
    the pair again to replace it) and is None."""
    try:
        return PairingRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        set_aside(path, "the pairing record", f"{exc}; run `tandem tune` to make a new one")
        return None


def all_records() -> list[PairingRecord]:
    """Every readable record, newest first; an unreadable file is set aside, not fatal."""
    found = (_read(path) for path in record_paths())
    return sorted((r for r in found if r is not None), key=lambda r: r.date, reverse=True)


def find(key: PairKey) -> PairingRecord | None:
    record = _read(record_path(key))
    return record if record is not None and record.key == key else None


def adapted_draft(key: PairKey) -> Path | None:
    """The adapted draft to load for `key` instead of its draft: the one its record names, when
    it was made for exactly these files (target, adapters, draft), beat the base draft, and its
    file is there. A record of another key never lends its adapted draft: a changed target,
    adapter or draft retires it."""
    record = find(key)
    a = record.adapted if record is not None else None
    if a is None or not a.wins or not a.applies_to(key) or not a.path.is_file():
        return None
    return a.path


def stale_for(key: PairKey) -> list[PairingRecord]:
    """Records for the same draft with another target or adapter: the draft was tuned for
    another version of the target."""
    if not key.draft_sha256:
        return []
    return [r for r in all_records() if r.key.draft_sha256 == key.draft_sha256
            and (r.key.target_sha256, r.key.adapter_sha256)
            != (key.target_sha256, key.adapter_sha256)]
