"""A cheaper draft model: the user's draft requantized to Q4_0 by llama.cpp's own quantizer.

On a CPU a draft's cost per token is what decides whether speculation pays, and llama.cpp's Q4_0
kernels (with runtime repacking) are its fastest. Measured here on the embedded
Qwen2.5-Coder-0.5B (a Q5_0/Q8_0 mix, 6.2 bits per weight): 42.8-45.6 -> 28.2-32.6 ms per drafted
token, while its teacher-forced greedy agreement with the 1.5B target moved from 0.846 to 0.825
over 18 suite prompts (bench/research/measure_costs.py decode / agree). Exactness does not depend on
the draft, only speed does.

The derived file lives in the store under `derived/`, named with the source's SHA-256, so a
changed draft gets a new file (the stale one is removed) and an unchanged one is reused
(loading/derived/files.py).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import gguf

from engine.llama import quantize as llama_quantize
from engine.errors import ModelFileError, SettingsError
from loading.derived.files import derive
from models.gguf_info import GGUFInfo

# --draft-quant values: "auto" requantizes a heavy draft that runs on the CPU; "off" never;
# q8_0 and q4_k are there for `tandem tune`, which measures them against Q4_0.
CHOICES = ("auto", "q4_0", "q8_0", "q4_k", "off")
# Above this many bits per weight a CPU draft is worth requantizing (Q4_0 stores 4.5; Q4_K_M
# files, with their Q6_K output head, come to about 4.9).
AUTO_MIN_BITS = 5.5

Quantizer = Callable[[Path, Path, str], None]


def bits_per_weight(model: GGUFInfo) -> float:
    """Stored bits per weight over the file's matrices (what a decode reads and multiplies)."""
    mats = [t for t in model.tensors if len(t.shape) >= 2]
    weights = sum(int(t.shape[0]) * int(t.shape[1]) for t in mats)
    if not weights:
        raise ModelFileError(f"{model.path.name} holds no weight matrices")
    return 8.0 * sum(t.n_bytes for t in mats) / weights


def resolve(choice: str, model: GGUFInfo, gpu_layers: int) -> str | None:
    """The quantization to derive for this draft (its header `model`), or None to use the file
    as it is."""
    if choice not in CHOICES:
        raise SettingsError(f"unknown draft quantization {choice!r}; choose one of {', '.join(CHOICES)}")
    if choice == "off":
        return None
    if choice == "auto":
        # On a GPU the draft's weights are not the bottleneck; keep the user's file.
        if gpu_layers != 0 or bits_per_weight(model) <= AUTO_MIN_BITS:
            return None
        return "q4_0"
    return choice


def planned_info(model: GGUFInfo, kind: str) -> GGUFInfo:
    """`model`'s header as its requantization to `kind` will be, for the plan before the file
    is derived: every matrix whose rows split into `kind`'s blocks stored as `kind` (the
    quantizer is "pure", embeddings and output included; engine/llama/quantize.py), the norms
    and other vectors as they are."""
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    tensors = tuple(
        replace(t, type_name=qtype.name, n_bytes=_elements(t.shape) // block * size)
        if len(t.shape) >= 2 and t.shape[0] % block == 0 else t for t in model.tensors)
    return replace(model, tensors=tensors, file_type=qtype.name,
                   tensor_bytes=sum(t.n_bytes for t in tensors))


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def derive_quantized(source: str | Path, kind: str, quantizer: Quantizer | None = None) -> Path:
    """Path of `source` requantized to `kind`, building it unless a current one exists."""
    # Looked up at the call, so a test can stand in for llama.cpp's quantizer.
    quantize = quantizer or llama_quantize.quantize
    return derive(source, kind, lambda src, sha: lambda tmp: quantize(src, tmp, kind))
