"""The two copies of a draft that adapting it writes (loading/derived/gguf_copy.py): the one the
trainer loads, with the tensors that train stored as F32 (llama.cpp trains F32 tensors only) and
every other tensor as stored, and the adapted draft itself, the draft byte for byte but for the
trained tensors, stored again in their own quantization.

Only the trained tensors are converted, both ways, so the rest of the draft keeps its
quantization: the trainer's forward pass runs on the quantized blocks (2-core CPU, Qwen2.5-Coder
0.5B, 256-token steps: 15 s with an F32 copy of the whole draft, less with this one), and an
untrained tensor of the adapted draft is the draft's own. A type that gguf-py cannot quantize
(the K-quants) is stored as Q8_0.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from loading.derived.gguf_copy import Tensor, kept, write_copy
from models.gguf_file import GGUFFile
from models.gguf_info import TensorInfo, read_info

F32 = gguf.GGMLQuantizationType.F32
Q8_0 = gguf.GGMLQuantizationType.Q8_0
# Which tensors train, by name: the last blocks without the head (the default: the head is most
# of a step's cost and, trained, the setting the project's sweep found worst), the head with its
# norm, or both.
TRAIN_SETS = ("last2", "last4", "head", "head+last2")


def trains(train_set: str, n_layer: int) -> Callable[[str], bool]:
    """The name filter of a train set, for a draft of `n_layer` blocks."""
    if train_set not in TRAIN_SETS:
        raise ValueError(f"unknown train set {train_set!r}; choose one of {', '.join(TRAIN_SETS)}")
    head = train_set.startswith("head")
    last = int(train_set.rsplit("last", 1)[1]) if "last" in train_set else 0
    blocks = tuple(f"blk.{i}." for i in range(max(n_layer - last, 0), n_layer))

    def chosen(name: str) -> bool:
        return (head and name.startswith(("output.", "output_norm."))) or (
            bool(blocks) and name.startswith(blocks))
    return chosen


def _as_f32(source: GGUFFile, t: TensorInfo) -> Tensor:
    qtype = gguf.GGMLQuantizationType(t.ggml_type)
    values = gguf.quants.dequantize(np.asarray(source.data(t)), qtype).astype(np.float32)
    return replace(t, type_name="F32", ggml_type=int(F32), n_bytes=values.nbytes), t.shape, values


def write_trainable(draft: Path, out: Path, chosen: Callable[[str], bool]) -> list[str]:
    """Write `draft` to `out` with the tensors `chosen` accepts as F32; their names."""
    source = GGUFFile(read_info(draft))
    names = [t.name for t in source.info.tensors if chosen(t.name)]
    write_copy(source, out, {}, [], (_as_f32(source, t) if chosen(t.name) else kept(t, source)
                                     for t in source.info.tensors))
    return names


def _requantized(t: TensorInfo, values: np.ndarray) -> Tensor:
    qtype = gguf.GGMLQuantizationType(t.ggml_type)
    if qtype != F32:
        try:
            data = gguf.quants.quantize(values, qtype)
        except NotImplementedError:
            qtype = Q8_0
            data = gguf.quants.quantize(values, qtype)
        return replace(t, type_name=qtype.name, ggml_type=int(qtype), n_bytes=data.nbytes), \
            t.shape, data
    return t, t.shape, values


def write_adapted(draft: Path, trained: Path, out: Path, names: list[str]) -> None:
    """Write `draft` to `out` with the tensors `names` taken from `trained` (the trainer's
    saved model) and stored in the draft's own types."""
    source, result = GGUFFile(read_info(draft)), GGUFFile(read_info(trained))
    wanted = set(names)

    def tensor(t: TensorInfo) -> Tensor:
        if t.name not in wanted:
            return kept(t, source)
        got = result.tensor(t.name)
        if got is None or got.ggml_type != int(F32):
            raise ValueError(f"the trained model has no F32 {t.name}")
        values = np.asarray(result.data(got)).view(np.float32).reshape(tuple(reversed(t.shape)))
        return _requantized(t, values)

    write_copy(source, out, {}, [], (tensor(t) for t in source.info.tensors))
