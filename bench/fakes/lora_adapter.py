"""Write a small GGUF LoRA adapter for a model with the `gguf` package, in llama.cpp's layout
(loading/adapters.py): random low-rank A and B on a few layers' matrices. No adapter for the
embedded pair exists offline; this one stands in for a fine-tune that moves the target away
from its draft, by an amount set with the scale it is applied at."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from models.gguf_info import read_info

# Matrices adapted in each chosen layer: the attention output and the FFN's down projection,
# the two that write into the residual stream.
DEFAULT_MATRICES = ("attn_output", "ffn_down")


@functools.lru_cache(maxsize=4)
def _layout(model: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """A model's architecture and tensor shapes (ggml order), from Tandem's own header reader:
    0.3 s for the embedded target, where gguf's GGUFReader takes seconds over its 151,936
    vocabulary strings."""
    info = read_info(model)
    return info.architecture, {t.name: tuple(int(n) for n in t.shape) for t in info.tensors}


def write_lora(model: str | Path, out: str | Path, layers: Sequence[int], rank: int = 8,
               matrices: Sequence[str] = DEFAULT_MATRICES, seed: int = 0,
               strength: float = 1.0, arch: str | None = None) -> Path:
    """An adapter for `model` on `layers`. B A has the Frobenius norm of the matrix it adapts
    times `strength` (at scale 1, alpha = rank), so the scale it is applied at reads as the
    fraction of the weight it perturbs."""
    model_arch, shapes = _layout(str(model))
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


# Layers the test adapter perturbs on the embedded 1.5B target (28 layers): the first four, so
# every early-exit draft carries the whole adapter. Spread over layers 2-17 instead, scale 1 cut
# the draft's acceptance from 0.67 to 0.41 but early exit at 21 layers to 0.02: the deeper
# perturbations leave the truncated model nothing to agree with.
TEST_LAYERS = (0, 1, 2, 3)
# Spread over the middle layers the adapter changes the answers and keeps them coherent: the
# adapter `tandem adapt --lora` is measured with (docs/BENCHMARKS.md).
MID_LAYERS = (2, 5, 8, 11, 14, 17)
# Early exit this deep agrees with the adapted target more often than the unadapted draft does.
TEST_EXIT_LAYERS = 26
WEAK_SCALE = 0.05
STRONG_SCALE = 1.0


def acceptance(target: str, draft: str | None, lora: Sequence[tuple[str, float]],
               drafter: str, prompts: Sequence[str], max_tokens: int = 48,
               early_exit_layers: int | None = None) -> tuple[float, list[str]]:
    """Pooled greedy acceptance of `drafter` (fixed gamma 4, full drafts) for the target with
    these adapters, and the texts; the draft is loaded as given."""
    from engine.backend import ModelConfig
    from engine.events import DoneEvent
    from engine.generation_config import GenerationConfig
    from engine.control.registry import make_policy
    from loading.options import LoadOptions
    from loading.load import load_pair
    # One thread: acceptance does not depend on it, and a shared CPU runs it faster.
    tcfg = ModelConfig(str(target), n_ctx=512, n_threads=1, lora=tuple(lora))
    dcfg = ModelConfig(str(draft), n_ctx=512, n_threads=1) if draft else None
    pair = load_pair(tcfg, dcfg, LoadOptions(draft_quant="off",
                                             early_exit_layers=early_exit_layers), chain_min=0.0)
    drafted = accepted = 0
    texts = []
    try:
        for p in prompts:
            done = None
            for ev in pair.generate(p, GenerationConfig(gamma=4, max_tokens=max_tokens),
                                    drafter=drafter, policy=make_policy("fixed", 4)):
                if isinstance(ev, DoneEvent):
                    done = ev
            drafted += done.stats.drafted_tokens
            accepted += done.stats.accepted_tokens
            texts.append(done.text)
    finally:
        pair.close()
    return (accepted / drafted if drafted else 0.0), texts


def main() -> int:
    """`python -m bench.fakes.lora_adapter OUT [--layers 2,5,8]`: write the test adapter for the
    embedded target (default: the middle layers, which keep its answers coherent)."""
    import argparse
    from models import embedded
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", default=",".join(map(str, MID_LAYERS)))
    args = ap.parse_args()
    target, _ = embedded.ensure()
    print(write_lora(target, args.out, [int(x) for x in args.layers.split(",")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
