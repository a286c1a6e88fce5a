"""Write a small GGUF LoRA adapter for a model with the `gguf` package, in llama.cpp's layout
(engine/adapters.py): random low-rank A and B on a few layers' matrices. No adapter for the
embedded pair exists offline; this one stands in for a fine-tune that moves the target away
from its draft, by an amount set with the scale it is applied at."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

# Matrices adapted in each chosen layer: the attention output and the FFN's down projection,
# the two that write into the residual stream.
DEFAULT_MATRICES = ("attn_output", "ffn_down")


def write_lora(model: str | Path, out: str | Path, layers: Sequence[int], rank: int = 8,
               matrices: Sequence[str] = DEFAULT_MATRICES, seed: int = 0,
               strength: float = 1.0, arch: str | None = None) -> Path:
    """An adapter for `model` on `layers`. B A has the Frobenius norm of the matrix it adapts
    times `strength` (at scale 1, alpha = rank), so the scale it is applied at reads as the
    fraction of the weight it perturbs."""
    reader = gguf.GGUFReader(str(model))
    model_arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), arch or model_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    for layer in layers:
        for m in matrices:
            name = f"blk.{layer}.{m}.weight"
            n_in, n_out = shapes[name][:2]
            # Entries of B A then have variance (strength * 0.02)^2: a typical weight entry of
            # these models is about 0.02 (a quantized weight's norm is not read cheaply).
            a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, rank)) * strength * 0.02 * np.sqrt(n_in / rank)
            # f32: llama.cpp's LoRA matmuls take f32 or f16, not numpy's default f64.
            w.add_tensor(f"{name}.lora_a", a.astype(np.float32))
            w.add_tensor(f"{name}.lora_b", b.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
