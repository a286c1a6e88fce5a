"""scripts/gpu-check's Python half, on a tiny shape: a random-weight Qwen2 GGUF that llama.cpp
quantizes to Q4_K_M, loads and decodes (the full-size pair is the same code at 7B or 14B and
0.5B), the verify curve to width 64, and the GPU profile derived from a check's JSON."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from bench.benchmark.gpu_profile import parse
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


def test_the_14b_target_is_qwen25_14bs_shape_and_quantizes_by_rows_of_256():
    t = gpu_check.TARGETS["14b"]
    assert (t.n_layer, t.n_embd, t.n_ff, t.n_head, t.n_head_kv) == (48, 5120, 13824, 40, 8)
    params = sum(int(np.prod(s)) for _, s, _ in gpu_check.tensors(t))
    assert 14.0e9 < params < 15.0e9 and t.head_dim == 128
    assert all(s[-1] % 256 == 0 for _, s, _ in gpu_check.tensors(t) if len(s) == 2)
    assert gpu_check.described("14b")["target"].startswith("Qwen2.5-14B-shaped Q4_K_M target (48 blocks")


def test_the_curve_reaches_width_64_and_becomes_a_profile(tmp_path):
    paths = []
    for role, shape in gpu_check.TINY.items():
        f16 = gpu_check.write_model(tmp_path / f"{role}.f16.gguf", shape, role)
        paths.append(tmp_path / f"{role}.Q4_K_M.gguf")
        quantize(f16, paths[-1], "q4_k", threads=1, pure=False)
    out = tmp_path / "curve.json"
    assert gpu_check.main(["curve", str(paths[0]), str(paths[1]), str(out), "--ctx", "128",
                           "--reps", "1"]) == 0
    curve = json.loads(out.read_text())
    assert curve["widths"] == list(gpu_check.CURVE_WIDTHS) and curve["widths"][-1] == 64
    assert len(curve["verify_ms"]) == len(curve["draft_ms"]) == 15
    assert min(curve["verify_ms"]) > 0 and min(curve["draft_ms"]) > 0
    report = {"gpu": "name, compute_cap, memory.total [MiB], memory.free [MiB], driver_version\n"
                     "NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 81000 MiB, 570.1",
              "build": "llama-cpp-python 0.3.36's llama.cpp, CUDA 12.8 for compute 9.0",
              "write": gpu_check.described("7b", tiny=True), "curve": curve}
    data = gpu_check.profile_of(report, "2026-12-07", None, "gpu-check.json")
    p = parse(data)
    assert p.label == "H100 80GB HBM3 measured, tiny-shaped Q4_K_M target, 2026-12-07"
    assert p.widths[-1] == 64 and p.verify(64) == curve["verify_ms"][-1]
    assert "measured at widths 1-9, 12, 16, 24, 32, 48, 64, past 64 linear" in p.description
    assert data["source"] == "gpu-check.json: curve"


def test_the_h200_profile_is_derived_from_its_checks_json_by_the_script(tmp_path):
    gpu = Path(ROOT / "docs" / "results" / "latest" / "gpu")
    committed = json.loads((gpu / "h200-profile.json").read_text())
    out = tmp_path / "profile.json"
    assert gpu_check.main(["profile", str(gpu / "h200-gpu-check.json"), str(out), "--date",
                           committed["date"], "--target", "7b", "--build", committed["build"]]) == 0
    assert json.loads(out.read_text()) == committed
    # A check that names no target's shape (the H200 run predates it) says what to give.
    assert gpu_check.main(["profile", str(gpu / "h200-gpu-check.json"), str(out), "--build",
                           "x"]) == 2
