"""The early-exit draft's GGUF: the target's own first k layers and output head.

It is derived locally from the target GGUF: every metadata key is copied, the architecture's
`block_count` is set to k, and only the tensors of blocks < k are kept beside the embeddings,
final norm and output head. The file is tagged with the target's SHA-256 and named by the store's
rule (loading/derived/files.py), so a changed target yields a new file while an unchanged one is
reused. llama.cpp then loads it like any other draft model (engine/drafters/early_exit.py).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import gguf

from engine.errors import ModelFileError, SettingsError
from loading.derived.files import derive
from loading.derived.gguf_copy import kept, write_copy
from models.gguf_file import GGUFFile
from models.gguf_info import GGUFInfo, read_info

# Measured on the embedded 1.5B (28 layers): the first third to half of the layers agree with
# the full model's greedy token only 2-15% of the time, three quarters about 35-40%.
DEFAULT_FRACTION = 0.75
SOURCE_KEY = "tandem.early_exit.source_sha256"
LAYERS_KEY = "tandem.early_exit.layers"
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def default_layers(n_layer: int) -> int:
    return max(1, min(n_layer - 1, round(n_layer * DEFAULT_FRACTION)))


def block_count(path: Path) -> int:
    info = read_info(path)
    if not info.n_layer:
        raise ModelFileError(f"{Path(path).name} has no {info.architecture}.block_count")
    return info.n_layer


def tag(layers: int) -> str:
    return f"early-exit-{layers}"


def _write(source: GGUFFile, out: Path, layers: int, sha: str) -> None:
    info = source.info
    changed = {f"{info.architecture}.block_count": layers,
               gguf.Keys.General.NAME: f"{info.name} (early exit {layers} layers)"}
    tensors = [kept(t, source) for t in info.tensors
               if not (m := _BLOCK.match(t.name)) or int(m.group(1)) < layers]
    write_copy(source, out, changed,
               [(SOURCE_KEY, sha, gguf.GGUFValueType.STRING, None),
                (LAYERS_KEY, layers, gguf.GGUFValueType.UINT32, None)], tensors)


def derive_early_exit(target: str | Path, layers: int, info: GGUFInfo | None = None) -> Path:
    """Path of the k-layer early-exit GGUF of `target`, building it unless a current one exists;
    `info` is target's header when the caller has read it (else it is read when building)."""
    if layers < 1:
        raise SettingsError(f"early-exit layers must be >= 1, got {layers}")

    def prepare(target: Path, sha: str) -> Callable[[Path], None]:
        header = info if info is not None and info.path.resolve() == target.resolve() else read_info(target)
        if not header.n_layer:
            raise ModelFileError(f"{target.name} has no {header.architecture}.block_count")
        if layers >= header.n_layer:
            raise SettingsError(f"early-exit layers must be between 1 and {header.n_layer - 1} "
                                f"for {target.name}, got {layers}")
        source = GGUFFile(header)
        return lambda tmp: _write(source, tmp, layers, sha)

    return derive(target, tag(layers), prepare)
