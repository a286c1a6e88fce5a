"""scripts/gpu-check's model writer, on a tiny shape: a random-weight Qwen2 GGUF that llama.cpp
quantizes to Q4_K_M, loads and decodes (the full-size pair is the same code at 7B and 0.5B)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from engine.backend import ModelConfig
from engine.llama.backend import LlamaBackend
from engine.llama.quantize import quantize
from models.gguf_info import read_info

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up there
_spec.loader.exec_module(gpu_check)


def test_the_full_shapes_are_qwen25_7b_and_05b():
    t, d = gpu_check.SHAPES["target"], gpu_check.SHAPES["draft"]
    params = [sum(int(np.prod(s)) for _, s, _ in gpu_check.tensors(x)) for x in (t, d)]
    assert 7.0e9 < params[0] < 7.7e9 and 0.45e9 < params[1] < 0.55e9
    assert not t.tied and d.tied and t.n_vocab == d.n_vocab == 151936


def test_a_tiny_random_pair_quantizes_loads_and_decodes(tmp_path):
    shape = gpu_check.TINY["target"]
    f16 = gpu_check.write_model(tmp_path / "t.f16.gguf", shape, "tiny")
    q4 = tmp_path / "t.Q4_K_M.gguf"
    quantize(f16, q4, "q4_k", threads=1, pure=False)
    info = read_info(q4)
    assert info.n_layer == shape.n_layer and info.n_vocab == shape.n_vocab
    assert {t.type_name for t in info.tensors if t.name.endswith("ffn_up.weight")} == {"Q4_K"}
    with LlamaBackend(ModelConfig(str(q4), n_ctx=64, n_threads=1)) as backend:
        tokens = backend.tokenize("def f(x): return x", add_special=False)
        assert tokens and all(0 <= t < shape.n_vocab for t in tokens)
        logits = backend.decode(tokens, 0, [len(tokens) - 1])
        assert logits.shape == (1, shape.n_vocab) and np.isfinite(logits).all()
