"""What llama.cpp allocated, read from its own log lines (engine/llama/allocations.py), and the
budget's accounting checked against it on the CPU, where every machine can (the device's own
check is tests/test_vulkan_path.py)."""
from __future__ import annotations

import pytest

from engine.backend import ModelConfig
from engine.llama.allocations import MIB, Allocations, capture_allocations
from engine.llama.backend import LlamaBackend
from models.budget import Layout, estimate_model
from models.gguf_info import read_info
from tests.realmodels import smollm2_135m

LINES = [
    "load_tensors:      Vulkan0 model buffer size =   123.45 MiB\n",
    "load_tensors:   CPU_Mapped model buffer size =    80.00 MiB\n",
    "llama_kv_cache:      Vulkan0 KV buffer size =    12.00 MiB\n",
    "llama_context:  Vulkan_Host  output buffer size =     0.58 MiB\n",
    "llama_context:      Vulkan0 compute buffer size =    45.50 MiB\n",
    "llama_context: n_ctx_per_seq (256) < n_ctx_train (8192)\n",
    "load_tensors: offloaded 31/31 layers to GPU\n",
]


def test_the_log_lines_are_read_per_buffer_kind_and_section():
    found = Allocations()
    found.mark("target")
    for line in LINES[:3]:
        found.take(line)
    found.mark("draft")
    for line in LINES[3:]:
        found.take(line)
    assert found.names() == ["Vulkan0", "CPU_Mapped", "Vulkan_Host"]
    assert found.on("Vulkan0", "target") == {"weights": round(123.45 * MIB), "kv": 12 * MIB,
                                             "compute": 0, "output": 0}
    assert found.on("Vulkan0", "draft")["compute"] == round(45.5 * MIB)
    assert found.on("Vulkan0")["compute"] == round(45.5 * MIB)
    assert found.on("Vulkan_Host")["output"] == round(0.58 * MIB)
    # Lines that report no allocation are not taken.
    assert len(found.buffers) == 5
    assert found.on("CUDA0") == {"weights": 0, "kv": 0, "compute": 0, "output": 0}


@pytest.mark.real
def test_the_budget_counts_what_llama_cpp_allocates_on_the_cpu():
    path = smollm2_135m()
    with capture_allocations() as found:
        found.mark("model")
        backend = LlamaBackend(ModelConfig(str(path), n_ctx=512, n_threads=2, n_gpu_layers=0))
        backend.close()
    planned = estimate_model(Layout.from_info(read_info(path)), role="target", n_ctx=512)
    kv = found.on("CPU", "model")["kv"]
    weights = found.on("CPU_Mapped", "model")["weights"]
    report = f"planned {planned}; allocated {found.buffers}"
    assert kv and abs(planned.kv_cpu - kv) <= MIB, report
    assert weights and abs(planned.weights_cpu - weights) <= 0.02 * weights, report
    # Nothing was captured after the block: llama.cpp is quiet again.
    assert found.section == "model"
