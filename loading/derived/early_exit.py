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
from loading.derived.gguf_copy import open_gguf, write_copy

# Measured on the embedded 1.5B (28 layers): the first third to half of the layers agree with
# the full model's greedy token only 2-15% of the time, three quarters about 35-40%.
DEFAULT_FRACTION = 0.75
SOURCE_KEY = "tandem.early_exit.source_sha256"
LAYERS_KEY = "tandem.early_exit.layers"
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def default_layers(n_layer: int) -> int:
    return max(1, min(n_layer - 1, round(n_layer * DEFAULT_FRACTION)))


def _field_value(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def block_count(path: Path) -> int:
    reader = gguf.GGUFReader(str(path))
    arch = _field_value(reader, gguf.Keys.General.ARCHITECTURE)
    n = _field_value(reader, f"{arch}.block_count")
    if n is None:
        raise ModelFileError(f"{Path(path).name} has no {arch}.block_count")
    return int(n)


def tag(layers: int) -> str:
    return f"early-exit-{layers}"


def _write(reader: gguf.GGUFReader, out: Path, layers: int, sha: str) -> None:
    arch = str(_field_value(reader, gguf.Keys.General.ARCHITECTURE))
    name = _field_value(reader, gguf.Keys.General.NAME) or Path(out).stem
    changed = {f"{arch}.block_count": layers,
               gguf.Keys.General.NAME: f"{name} (early exit {layers} layers)"}
    kept = [(t, t.data) for t in reader.tensors
            if not (m := _BLOCK.match(t.name)) or int(m.group(1)) < layers]
    write_copy(reader, out, lambda key, value: changed.get(key, value),
               [(SOURCE_KEY, sha, gguf.GGUFValueType.STRING, None),
                (LAYERS_KEY, layers, gguf.GGUFValueType.UINT32, None)], kept)


def derive_early_exit(target: str | Path, layers: int) -> Path:
    """Path of the k-layer early-exit GGUF of `target`, building it unless a current one exists."""
    if layers < 1:
        raise SettingsError(f"early-exit layers must be >= 1, got {layers}")

    def prepare(target: Path, sha: str) -> Callable[[Path], None]:
        reader = open_gguf(target)
        arch = _field_value(reader, gguf.Keys.General.ARCHITECTURE)
        total = _field_value(reader, f"{arch}.block_count")
        if total is None:
            raise ModelFileError(f"{target.name} has no {arch}.block_count")
        if layers >= int(total):
            raise SettingsError(f"early-exit layers must be between 1 and {int(total) - 1} "
                                f"for {target.name}, got {layers}")
        return lambda tmp: _write(reader, tmp, layers, sha)

    return derive(target, tag(layers), prepare)
