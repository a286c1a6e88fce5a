"""Pairs from what is on disk: for each model found (models/found.py), the found drafts that
`compat` accepts for it, best first, each with the memory budget's verdict for the pair.

A draft is a smaller model (fewer parameters) of the same tokenizer type whose vocabulary is
within llama.cpp's tolerance; `compat.compare` then decides, on both headers. Best first means:
compatible before compatible-with-warnings, fits before fits-with-offload before does not fit,
the target's own architecture first, then the cheaper draft (fewer parameters, then the smaller
file). Headers are read again only for the candidates, and once each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from engine.errors import ModelFileError
from models import budget, compat
from models import machine as machine_mod
from models.found import FoundModel
from models.gguf_info import GGUFInfo, read_info

BUDGET_ORDER = ("fits", "fits with offload", "does not fit")


@dataclass(frozen=True)
class DiskDraft:
    draft: FoundModel
    verdict: str  # compat.COMPATIBLE or compat.WARNING
    warnings: tuple[str, ...]
    budget: str  # one of BUDGET_ORDER

    def label(self) -> str:
        note = f" ({self.warnings[0]})" if self.warnings else ""
        return f"{self.draft.name}: {self.verdict}{note}; memory: {self.budget}"


@dataclass(frozen=True)
class DiskPair:
    target: FoundModel
    drafts: list[DiskDraft] = field(default_factory=list)


def _candidate(target: FoundModel, draft: FoundModel) -> bool:
    return (draft.ok and draft.path != target.path and draft.params < target.params
            and draft.tokenizer_model == target.tokenizer_model
            and abs(draft.n_vocab - target.n_vocab) <= compat.VOCAB_MAX_SIZE_DIFFERENCE)


def _rank(target: FoundModel, d: DiskDraft) -> tuple:
    return (d.verdict != compat.COMPATIBLE, BUDGET_ORDER.index(d.budget),
            d.draft.architecture != target.architecture, d.draft.params, d.draft.size, d.draft.name)


class HeaderCache:
    """read_info once per file, for the candidates only (a header holds the whole vocabulary,
    so only the models being paired are kept)."""

    def __init__(self) -> None:
        self._infos: dict[Path, GGUFInfo] = {}

    def __call__(self, model: FoundModel) -> GGUFInfo:
        if model.path not in self._infos:
            self._infos[model.path] = read_info(model.path)
        return self._infos[model.path]


def drafts_for(target: FoundModel, found: Sequence[FoundModel], *, n_ctx: int = 4096,
               machine: machine_mod.Machine | None = None, headers: HeaderCache | None = None) -> list[DiskDraft]:
    """The found drafts compat accepts for `target`, best first (see the module docstring)."""
    if not target.ok:
        return []
    m = machine or machine_mod.detect()
    info = headers or HeaderCache()
    out = []
    for draft in found:
        if not _candidate(target, draft):
            continue
        try:
            report = compat.compare(info(target), info(draft))
            fit = budget.estimate_pair(info(target), info(draft), n_ctx=n_ctx, machine=m)
        except ModelFileError:
            continue  # changed on disk since the scan: the next listing says why
        if not report.ok:
            continue
        out.append(DiskDraft(draft, report.verdict, tuple(report.warnings), fit.verdict))
    return sorted(out, key=lambda d: _rank(target, d))


def pairs(found: Sequence[FoundModel], *, n_ctx: int = 4096,
          machine: machine_mod.Machine | None = None) -> list[DiskPair]:
    """Every found model that has at least one draft on disk, with its drafts, largest target first."""
    m = machine or machine_mod.detect()
    headers = HeaderCache()
    out = [DiskPair(t, drafts_for(t, found, n_ctx=n_ctx, machine=m, headers=headers))
           for t in sorted((f for f in found if f.ok), key=lambda f: (-f.params, f.name))]
    return [p for p in out if p.drafts]
