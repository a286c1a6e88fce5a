"""GGUF LoRA adapters: what one holds, whether it fits a model, and its layer-trimmed copy.

llama.cpp's adapter layout (src/llama-adapter.cpp, convert_lora_to_gguf.py): metadata
`general.type` = "adapter", `adapter.type` = "lora", `adapter.lora.alpha` (f32) and the base
model's `general.architecture`; for each adapted matrix W (ggml shape [in, out]) two tensors
`<W's name>.lora_a` ([in, rank]) and `.lora_b` ([rank, out]). At every decode llama.cpp adds
scale * alpha / rank * B A to W (scale alone when alpha is 0). Every adapted tensor must exist in
the model, so the early-exit draft (the target's first k layers) takes a copy of the target's
adapter without the tensors of layers >= k (`adapter_for_layers`).

Exactness does not depend on the adapter: the adapted target is the model the user samples from,
and verification runs on it as on any target.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import gguf

from engine.errors import IncompatiblePairError, ModelFileError, SettingsError
from loading.derived.files import derive
from loading.derived.gguf_copy import kept, write_copy
from models.gguf_file import GGUFFile
from models.gguf_info import GGUFInfo, read_info

_BLOCK = re.compile(r"^blk\.(\d+)\.")
# Tensor types llama.cpp's LoRA matmuls are known to take.
LORA_TYPES = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
              gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.Q8_0)
# Scales beyond this are almost surely a typo (a LoRA is trained for 1).
MAX_SCALE = 100.0


@dataclass(frozen=True)
class AdapterInfo:
    path: Path
    architecture: str
    alpha: float
    rank: int
    # Names of the adapted model tensors, and the layers they sit in.
    targets: tuple[str, ...]
    layers: tuple[int, ...]
    n_bytes: int


def read_adapter(path: str | Path) -> AdapterInfo:
    """An adapter file's header; a clear error when it is not a LoRA adapter GGUF."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"LoRA adapter not found: {path}")
    info = read_info(path)
    kind = info.metadata.get(gguf.Keys.General.TYPE)
    if kind != "adapter" or info.metadata.get(gguf.Keys.Adapter.TYPE) != "lora":
        raise ModelFileError(f"{path.name} is not a LoRA adapter GGUF (general.type {kind!r}; "
                             "expected 'adapter' with adapter.type 'lora')")
    names = [t.name for t in info.tensors]
    targets = sorted({n[:-len(".lora_a")] for n in names if n.endswith(".lora_a")})
    if not targets or any(f"{t}.lora_b" not in names for t in targets):
        raise ModelFileError(f"{path.name} holds no complete lora_a/lora_b tensor pair")
    odd = [t for t in info.tensors if t.ggml_type not in LORA_TYPES]
    if odd:
        # llama.cpp would accept the file and crash at the first decode (an F64 tensor does).
        raise ModelFileError(f"{path.name}: tensor {odd[0].name} is {odd[0].type_name}; "
                             f"LoRA tensors must be one of {', '.join(t.name for t in LORA_TYPES)}")
    ranks = {int(t.shape[-1]) for t in info.tensors if t.name.endswith(".lora_a")}
    layers = sorted({int(m.group(1)) for t in targets if (m := _BLOCK.match(t))})
    return AdapterInfo(path, info.architecture,
                       float(info.metadata.get(gguf.Keys.Adapter.LORA_ALPHA) or 0.0),
                       max(ranks), tuple(targets), tuple(layers),
                       sum(t.n_bytes for t in info.tensors))


def check_adapters(model: GGUFInfo, lora: Sequence[tuple[str, float]]) -> None:
    """Refuse, in one line, adapters llama.cpp would reject for `model` (its header, read once
    by the loading step): another architecture, or a tensor the model does not have. Shapes are
    left to llama.cpp."""
    if not lora:
        return
    model_path = model.path
    arch = model.architecture
    tensors = {t.name for t in model.tensors}
    n_layer = model.n_layer
    for adapter_path, scale in lora:
        if not (-MAX_SCALE <= float(scale) <= MAX_SCALE):
            raise SettingsError(f"LoRA scale must be between -{MAX_SCALE:g} and {MAX_SCALE:g}, "
                                f"got {scale}")
        info = read_adapter(adapter_path)
        if info.architecture != arch:
            raise IncompatiblePairError(f"LoRA adapter {info.path.name} is for {info.architecture}"
                                        f", but {Path(model_path).name} is {arch}")
        missing = [t for t in info.targets if t not in tensors]
        if missing:
            deep = [t for t in missing if (m := _BLOCK.match(t)) and int(m.group(1)) >= n_layer]
            why = (f"layer {_BLOCK.match(deep[0]).group(1)}, past the model's {n_layer}"
                   if deep else f"tensor {missing[0]}")
            raise IncompatiblePairError(f"LoRA adapter {info.path.name} adapts {why}; it was "
                                        f"made for another model than {Path(model_path).name}")


def adapter_for_layers(path: str | Path, layers: int) -> Path:
    """The adapter without the tensors of layers >= `layers` (for a model made of the first
    `layers` layers): the file itself when it adapts none of them, else a copy derived once into
    the store (loading/derived/files.py), named with the adapter's SHA-256."""
    info = read_adapter(path)
    if all(layer < layers for layer in info.layers):
        return info.path

    def prepare(source: Path, sha: str):
        adapter = GGUFFile(read_info(source))
        tensors = [kept(t, adapter) for t in adapter.info.tensors
                   if not (m := _BLOCK.match(t.name)) or int(m.group(1)) < layers]
        return lambda tmp: write_copy(adapter, tmp, {}, [], tensors)

    return derive(path, f"layers-{layers}", prepare)


def adapter_bytes(lora: Sequence[tuple[str, float]]) -> int:
    """Memory the adapters take, by file size (tensors and a small header, all loaded); a
    missing file counts 0 (the checks report it)."""
    return sum(Path(p).stat().st_size for p, _ in lora if Path(p).is_file())
