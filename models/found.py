"""The models found on this machine (models/other_stores.py), each described from its GGUF header:
architecture, parameters, quantization, size, trained context and tokenizer family.

Only headers are read (models/gguf_info.py), so a scan of many files is quick. A file that
cannot be used (truncated by an interrupted download, not GGUF, a vision projector or an
adapter rather than a model, a manifest without its blob) is listed with the reason and never
stops the scan. The CLI, the app and the API show the same rows (COLUMNS, `cells`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from engine.errors import ModelFileError
from models.gguf_info import read_info
from models.other_stores import LABELS, Located, Place, locate, places

COLUMNS = ("name", "found in", "architecture", "parameters", "quantization", "size", "context",
           "tokenizer")


def size_text(n: int) -> str:
    gib, mib = 1 << 30, 1 << 20
    if n >= gib:
        return f"{n / gib:.2f} GiB"
    return f"{n / mib:.0f} MiB" if n >= mib else f"{n / 1024:.0f} KiB"


def params_text(n: int) -> str:
    if n >= 10**9:
        return f"{n / 10**9:.1f}B"
    if n >= 10**6:
        return f"{n / 10**6:.0f}M"
    return f"{n / 10**3:.0f}K"


@dataclass(frozen=True)
class FoundModel:
    source: str
    name: str
    path: Path
    size: int
    # Why the file cannot be used; empty for a usable model.
    problem: str = ""
    aliases: tuple[str, ...] = ()
    architecture: str = ""
    # Counted from the tensor shapes (a file may store a tied output matrix twice); `size_label`
    # is the converter's own figure (general.size_label, "1.5B"), shown when present.
    params: int = 0
    size_label: str = ""
    quant: str = ""
    n_ctx_train: int = 0
    tokenizer_model: str = ""
    tokenizer_pre: str = ""
    n_vocab: int = 0

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def where(self) -> str:
        return LABELS[self.source]

    @property
    def tokenizer(self) -> str:
        """The tokenizer family: llama.cpp's tokenizer type, pre-tokenizer and vocabulary size."""
        return f"{self.tokenizer_model}/{self.tokenizer_pre} {self.n_vocab}"

    @property
    def parameters(self) -> str:
        return self.size_label or params_text(self.params)

    def cells(self) -> list[str]:
        """The row under COLUMNS; a broken file's details are its reason."""
        if not self.ok:
            return [self.name, self.where, "", "", "", size_text(self.size), "",
                    f"unusable: {self.problem}"]
        return [self.name, self.where, self.architecture, self.parameters, self.quant,
                size_text(self.size), str(self.n_ctx_train), self.tokenizer]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def describe(item: Located) -> FoundModel:
    """Read the header of one located file; any failure becomes the row's reason."""
    base: dict[str, Any] = dict(source=item.source, name=item.name, path=item.path, size=_size(item.path),
                aliases=item.aliases)
    if item.problem:
        return FoundModel(**base, problem=item.problem)
    try:
        info = read_info(item.path)
    except ModelFileError as exc:
        # The row shows the name; the reason need not repeat the full path.
        return FoundModel(**base, problem=str(exc).replace(str(item.path), item.path.name))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return FoundModel(**base, problem=f"unreadable header ({type(exc).__name__}: {exc})")
    if not info.n_vocab or not info.tokenizer_model:
        kind = str(info.metadata.get("general.type") or info.architecture)
        return FoundModel(**base, architecture=info.architecture,
                          problem=f"no vocabulary: a {kind} file (projector or adapter), not a model")
    return FoundModel(**base, architecture=info.architecture,
                      params=sum(math.prod(t.shape) for t in info.tensors),
                      size_label=str(info.metadata.get("general.size_label") or ""), quant=info.file_type,
                      n_ctx_train=info.n_ctx_train, tokenizer_model=info.tokenizer_model,
                      tokenizer_pre=info.tokenizer_pre, n_vocab=info.n_vocab)


@dataclass(frozen=True)
class Scan:
    models: list[FoundModel]
    places: list[Place]

    @property
    def usable(self) -> list[FoundModel]:
        return [m for m in self.models if m.ok]

    @property
    def broken(self) -> list[FoundModel]:
        return [m for m in self.models if not m.ok]

    def where_searched(self) -> str:
        """One line: each place, and how many files it held (or that it does not exist)."""
        counts = {p.path: 0 for p in self.places}
        for m in self.models:
            for p in self.places:
                if m.path.is_relative_to(p.path):
                    counts[p.path] += 1
                    break
        return "; ".join(f"{LABELS[p.source]} {p.path} ({counts[p.path] if p.exists else 'absent'})"
                         for p in self.places)


def scan(extra_dirs: Sequence[str | Path] = ()) -> Scan:
    """Every GGUF found on this machine, described from its header, in search order."""
    return Scan([describe(item) for item in locate(extra_dirs)], places(extra_dirs))
