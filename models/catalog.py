"""The curated catalog of known-good target/draft pairs (models/catalog.json) and lookups in it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine.errors import SettingsError
from models import embedded
from models.tandem_store import store_dir

CATALOG_FILE = Path(__file__).with_name("catalog.json")
MIB = 1 << 20


@dataclass(frozen=True)
class FileRef:
    quant: str
    filename: str
    # Bytes: the exact size where the catalog records one, else its MiB estimate.
    approx_size: int
    # The file's byte count on the hub, where recorded: a pull refuses any other size.
    size: int | None = None


@dataclass(frozen=True)
class ModelRef:
    id: str
    name: str
    repo: str
    files: dict[str, FileRef]

    def file(self, quant: str) -> FileRef:
        try:
            return self.files[quant.upper()]
        except KeyError:
            raise SettingsError(f"{self.name} has no {quant} file in the catalog; known: {', '.join(self.files)}") from None


@dataclass(frozen=True)
class PairEntry:
    id: str
    family: str
    target: ModelRef
    draft: ModelRef
    target_quant: str
    draft_quant: str
    offline: bool
    note: str = ""

    @property
    def target_file(self) -> FileRef:
        return self.target.file(self.target_quant)

    @property
    def draft_file(self) -> FileRef:
        return self.draft.file(self.draft_quant)

    def local_paths(self) -> tuple[Path, Path]:
        """Where the pair's two files live (or will live) in the store."""
        if self.offline:
            return embedded.TARGET.path, embedded.DRAFT.path
        d = store_dir()
        return d / self.target_file.filename, d / self.draft_file.filename

    def is_local(self) -> bool:
        return all(p.is_file() for p in self.local_paths())


def _model(mid: str, raw: dict) -> ModelRef:
    files = {q: FileRef(q, f["file"], int(f.get("size") or f["size_mb"] * MIB), f.get("size"))
             for q, f in raw["files"].items()}
    return ModelRef(mid, raw["name"], raw["repo"], files)


@lru_cache(maxsize=4)
def _load(path: Path) -> tuple[PairEntry, ...]:
    data = json.loads(path.read_text())
    models = {mid: _model(mid, raw) for mid, raw in data["models"].items()}
    pairs = []
    for p in data["pairs"]:
        pairs.append(PairEntry(p["id"], p["family"], models[p["target"]], models[p["draft"]],
                               p["quant"]["target"], p["quant"]["draft"], bool(p.get("offline")), p.get("note", "")))
    return tuple(pairs)


def load_catalog(path: Path = CATALOG_FILE) -> list[PairEntry]:
    """All pairs, the embedded (offline) default first."""
    return list(_load(path))


def default_pair() -> PairEntry:
    return load_catalog()[0]


def find_pair(pair_id: str) -> PairEntry:
    """The pair with this id; SettingsError naming the known ids when there is none."""
    for pair in load_catalog():
        if pair.id == pair_id:
            return pair
    raise SettingsError(f"unknown pair {pair_id!r}; `tandem models list` shows the catalog")


def find_model(repo_or_id: str) -> ModelRef | None:
    """A catalog model by its id or hub repo id, for sizing a model before it is downloaded."""
    for pair in load_catalog():
        for m in (pair.target, pair.draft):
            if repo_or_id in (m.id, m.repo):
                return m
    return None


def recorded_size(repo_id: str, filename: str) -> int | None:
    """The byte count the catalog records for this hub file, or None (not in the catalog, or
    only an estimate)."""
    for pair in load_catalog():
        for model in (pair.target, pair.draft):
            found = [f.size for f in model.files.values()
                     if model.repo == repo_id and f.filename == filename and f.size is not None]
            if found:
                return found[0]
    return None
