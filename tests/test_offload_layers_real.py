"""llama.cpp's -ngl as the budget counts it, checked against llama.cpp itself. A CPU-only build
has no GPU, but an RPC worker is a device of type GPU to llama.cpp and is filled by the same
code (llama-model.cpp load_tensors), so a local rpc-server shows which tensors -ngl g puts on
a device: the output matrix first, then the blocks from the last one back."""
from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.llama.quantize import quantize
from models.budget import Layout, estimate_model
from models.gguf_info import read_info
from models.rpc_server import WorkerBuildError, find_rpc_server

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check
_spec.loader.exec_module(gpu_check)

# Loads the model once per -ngl with llama.cpp's log on stderr, each load after a marker line.
_CHILD = """
import ctypes, sys
import llama_cpp
from engine.llama.rpc import add_rpc_workers
@llama_cpp.llama_log_callback
def log(level, text, user_data):
    sys.stderr.write(text.decode(errors="replace"))
llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
add_rpc_workers([sys.argv[2]])
for ngl in sys.argv[3:]:
    sys.stderr.write(f"== ngl {ngl}\\n")
    llama_cpp.Llama(model_path=sys.argv[1], n_gpu_layers=int(ngl), n_ctx=256, n_threads=1,
                    verbose=True).close()
"""
_ON_WORKER = re.compile(r"RPC0\[[^\]]*\] (model|KV) buffer size =\s+([\d.]+) MiB")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def worker():
    try:
        exe = find_rpc_server()
    except WorkerBuildError as exc:
        pytest.skip(f"rpc-server is not built: {exc}")
    port = _free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("rpc-server did not start")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_ngl_places_the_output_matrix_first_as_the_budget_counts(tmp_path, worker, role):
    # The tiny draft has tied embeddings: its output matrix is a copy of the token embeddings.
    f16 = gpu_check.write_model(tmp_path / "t.f16.gguf", gpu_check.TINY[role], "tiny")
    path = tmp_path / "t.Q4_K_M.gguf"
    quantize(f16, path, "q4_k", threads=1, pure=False)
    layout = Layout.from_info(read_info(path))
    counts = list(range(1, layout.n_layer + 2))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), worker, *map(str, counts)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    loads = done.stderr.split("== ngl ")[1:]
    assert len(loads) == len(counts)
    for g, log in zip(counts, loads):
        on_worker = {kind: float(mib) for kind, mib in _ON_WORKER.findall(log)}
        est = estimate_model(layout, role="target", n_ctx=256, gpu_layers=g)
        # llama.cpp logs MiB to two decimals.
        assert abs(on_worker.get("model", 0.0) - est.weights_gpu / MIB) < 0.006, (g, log)
        assert abs(on_worker.get("KV", 0.0) - est.kv_gpu / MIB) < 0.006, (g, log)
    # -ngl 1 is the output matrix alone: the count the old reading (blocks first) got wrong.
    one = estimate_model(layout, role="target", n_ctx=256, gpu_layers=1)
    assert one.weights_gpu == layout.output_bytes + layout.output_copy_bytes > 0
    assert one.kv_gpu == 0 and (layout.output_copy_bytes > 0) == (role == "draft")
