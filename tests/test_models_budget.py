"""Memory budget: arithmetic on tiny headers, verdicts on made-up machines, and accuracy against
the buffer sizes llama.cpp itself reports for the embedded pair."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from engine.backend import ModelConfig
from engine.errors import DoesNotFitError, SettingsError
from loading.plan import budget_settings
from models.budget import Layout, estimate_model, estimate_pair, require_fits
from models.gguf_info import read_info
from models.machine import Machine, detect
from tests import realmodels, tinygguf

MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture
def pair(tmp_path):
    t = tinygguf.write(tmp_path / "t.gguf", n_layer=8, n_embd=64, n_head=8, n_head_kv=2, pad_bytes=0)
    d = tinygguf.write(tmp_path / "d.gguf", n_layer=2, n_embd=32, n_head=4, n_head_kv=2)
    return t, d


def test_kv_cache_scales_with_type_and_context(pair):
    lay = Layout.from_info(read_info(pair[0]))
    f16 = estimate_model(lay, role="target", n_ctx=1000, kv_type="f16")
    # padded to 1024 cells x 8 layers x (2 KV heads x (8 + 8)) x 2 bytes
    assert f16.kv_cpu == 1024 * 8 * 32 * 2
    q8 = estimate_model(lay, role="target", n_ctx=1000, kv_type="q8_0")
    q4 = estimate_model(lay, role="target", n_ctx=1000, kv_type="q4_0")
    assert q8.kv_cpu == 1024 * 8 * 32 // 32 * 34 and q4.kv_cpu == 1024 * 8 * 32 // 32 * 18
    assert estimate_model(lay, role="target", n_ctx=2048).kv_cpu == 2 * f16.kv_cpu


def test_gpu_layers_move_weights_and_kv(pair):
    lay = Layout.from_info(read_info(pair[0]))
    cpu = estimate_model(lay, role="target", n_ctx=1024)
    # -ngl 5 of 8 blocks: the output matrix and the last four blocks.
    half = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=5)
    full = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=99)
    assert cpu.weights_gpu == 0 and cpu.kv_gpu == 0
    assert half.kv_gpu == half.kv_cpu == cpu.kv_cpu // 2
    # Tied embeddings (no output.weight): the output matrix is a copy of them on the GPU.
    out = lay.output_bytes + lay.output_copy_bytes
    assert lay.output_bytes == 0 and lay.output_copy_bytes > 0
    assert half.weights_gpu == 4 * 64 * 64 * 4 + out
    assert half.weights_cpu + half.weights_gpu == cpu.weights_cpu + lay.output_copy_bytes
    assert full.kv_cpu == 0 and full.compute_gpu > 0 and full.compute_cpu < cpu.compute_cpu


def test_gpu_layers_count_the_output_matrix_first(pair):
    # llama.cpp (llama-model.cpp load_tensors) numbers the output matrix n_layer, after the
    # blocks, and offloads from that end: i_gpu_start = n_layer + 1 - ngl. So -ngl 1 is the
    # output matrix alone and -ngl n_layer leaves the first block on the CPU.
    lay = Layout.from_info(read_info(pair[0]))
    n = lay.n_layer
    one = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=1)
    assert one.weights_gpu == lay.output_bytes + lay.output_copy_bytes and one.kv_gpu == 0
    most = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=n)
    every = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=n + 1)
    assert most.weights_gpu == every.weights_gpu - lay.layer_bytes[0]
    assert most.kv_cpu == every.kv_gpu // n and every.kv_cpu == 0


def test_bad_settings(pair):
    lay = Layout.from_info(read_info(pair[0]))
    with pytest.raises(SettingsError, match="unknown KV cache type 'q5'"):
        estimate_model(lay, role="target", n_ctx=1024, kv_type="q5")
    with pytest.raises(SettingsError, match="must be positive"):
        estimate_model(lay, role="target", n_ctx=0)


def test_verdicts_on_made_up_machines(pair):
    t, d = pair
    big = Machine(64 * GIB, 60 * GIB)
    assert estimate_pair(t, d, n_ctx=4096, machine=big).verdict == "fits"
    need = estimate_pair(t, d, n_ctx=4096, machine=big).ram_needed
    tiny = Machine(need, need // 2)
    r = estimate_pair(t, d, n_ctx=4096, machine=tiny)
    assert r.verdict == "does not fit" and any("--ctx" in s for s in r.suggestions)
    with pytest.raises(DoesNotFitError, match=r"need .* GiB RAM \(weights .*KV .*compute .*--ctx \d+ fits"):
        require_fits(t, d, n_ctx=4096, machine=tiny)
    gpu = Machine(need, need // 2, "Test GPU", 4 * GIB, 4 * GIB)
    r = estimate_pair(t, d, n_ctx=4096, machine=gpu)
    assert r.verdict == "fits with offload" and r.split is not None
    assert r.ram_needed <= need // 2 and "--gpu-layers" in r.text()


def test_detect_reads_this_machine():
    m = detect()
    assert 0 < m.ram_available <= m.ram_total


_BUFFER = re.compile(r"(CPU_Mapped model|CPU_REPACK model|CPU KV|CPU compute|CPU\s+output) buffer size =\s+([\d.]+) MiB")
_PROBE = """
import sys, llama_cpp
llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=512, n_ubatch=512, n_threads=2,
                logits_all=False, verbose=True)
"""


def _reported(path, n_ctx: int) -> dict[str, float]:
    """Load the model in a child process (verbose) and parse the buffer sizes llama.cpp logs."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(n_ctx)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found: dict[str, float] = {}
    for kind, mib in _BUFFER.findall(proc.stderr):
        key = re.sub(r"\s+", " ", kind).split(" ")[0] if kind.startswith("CPU_") else kind.split()[1]
        found.setdefault(key, float(mib))
    return found


@pytest.mark.real
# 8192 is long: 2048 checks the same estimate against llama.cpp in the default suite.
@pytest.mark.parametrize("n_ctx", [2048, pytest.param(8192, marks=pytest.mark.long)])
def test_estimate_within_10_percent_of_llama_cpp(n_ctx):
    target, draft = realmodels.embedded_pair()
    report = estimate_pair(target, draft, n_ctx=n_ctx, machine=Machine(64 * GIB, 64 * GIB, cpu_repacks=detect().cpu_repacks))
    for path, est in ((target, report.target), (draft, report.draft)):
        got = _reported(path, n_ctx)
        pairs = {"weights": (est.weights_cpu, got["CPU_Mapped"]), "KV": (est.kv_cpu, got["KV"]),
                 "compute": (est.compute_cpu, got["compute"]), "output": (est.output_cpu, got["output"]),
                 "repacked": (est.repack_cpu, got.get("CPU_REPACK", 0.0))}
        total_est = sum(e for e, _ in pairs.values()) / MIB
        total_got = sum(g for _, g in pairs.values())
        print(f"{path.name} n_ctx {n_ctx}: " + ", ".join(f"{k} {e / MIB:.2f}/{g:.2f}" for k, (e, g) in pairs.items())
              + f"; total {total_est:.2f}/{total_got:.2f} MiB (estimate/llama.cpp)")
        assert abs(total_est - total_got) <= 0.10 * total_got
        for k, (e, g) in pairs.items():
            assert abs(e / MIB - g) <= 0.10 * g + 0.01, f"{k}: estimated {e / MIB:.2f} MiB, llama.cpp {g:.2f} MiB"


def test_the_budget_takes_the_settings_of_the_loads_model_configs(pair):
    t, d = pair
    big = Machine(64 * GIB, 60 * GIB)
    r = require_fits(t, d, machine=big, **budget_settings(
        ModelConfig(path=str(t), n_ctx=1024, n_batch=256), ModelConfig(path=str(d), n_ctx=512)))
    assert r.n_ctx == 1024
    assert r.draft.kv_cpu == estimate_model(Layout.from_info(read_info(d)), role="draft", n_ctx=512).kv_cpu
    alone = require_fits(t, None, machine=big, **budget_settings(ModelConfig(path=str(t), n_ctx=1024), None))
    assert alone.draft.cpu == 0
    # n_batch 256 halves the activation rows llama.cpp reserves compared with the default 512
    assert alone.target.compute_cpu > r.target.compute_cpu and alone.target.kv_cpu == r.target.kv_cpu


def test_an_output_matrix_the_gpu_refuses_stays_on_the_cpu_with_its_logits(pair):
    # Mesa's lavapipe takes no tensor over 128 MiB: llama.cpp keeps a larger output matrix (here
    # the tied copy of the embeddings) on the CPU, and computes the logits there.
    lay = Layout.from_info(read_info(pair[0]))
    out = lay.output_copy_bytes
    on_gpu = dict(role="target", n_ctx=1024, gpu_layers=99, flash_attn=True)
    full = estimate_model(lay, **on_gpu)
    fits = estimate_model(lay, **on_gpu, max_tensor=out)
    refused = estimate_model(lay, **on_gpu, max_tensor=out - 1)
    assert fits == full
    assert refused.weights_gpu == full.weights_gpu - out and refused.weights_cpu == full.weights_cpu
    logits = lay.n_vocab * 512 * 4 + 3 * lay.n_embd * 512 * 4
    assert full.compute_gpu >= logits and refused.compute_cpu >= logits > refused.compute_gpu
    # The pair's estimate takes the limit from the machine.
    card = Machine(64 * GIB, 64 * GIB, "card", 8 * GIB, 8 * GIB, gpu_max_tensor=out - 1)
    r = estimate_pair(pair[0], None, n_ctx=1024, gpu_layers=-1, machine=card)
    assert r.target.weights_gpu == refused.weights_gpu


def test_a_wide_feed_forward_sizes_the_block_compute(pair):
    from dataclasses import replace
    lay = Layout.from_info(read_info(pair[0]))
    ub, rows = 512, lay.n_embd * 512 * 4
    narrow = estimate_model(lay, role="target", n_ctx=1024, gpu_layers=8, flash_attn=True)
    # Qwen2.5 1.5B's feed-forward is 5.8x its width: gate, up and their product dominate.
    wide = replace(lay, n_ff=64 * 6)
    est = estimate_model(wide, role="target", n_ctx=1024, gpu_layers=8, flash_attn=True)
    assert est.compute_gpu == 3 * 64 * 6 * ub * 4 + 2 * rows > narrow.compute_gpu


@pytest.mark.real
def test_the_feed_forward_width_is_read_from_the_weights():
    target, draft = realmodels.embedded_pair()
    assert Layout.from_info(read_info(target)).n_ff == 8960
    assert Layout.from_info(read_info(draft)).n_ff == 4864
