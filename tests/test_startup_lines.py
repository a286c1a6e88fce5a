"""Start-up lines reach the terminal while the models load. A model load leaves the process's
stdout and stderr where they are (engine/llama/backend.py: llama-cpp-python's quiet mode used to
point them at /dev/null, losing what other threads printed meanwhile), and `tandem ui` and
`tandem ui --api`, started as a new user would with stdout a pipe, print their URL lines while
the models are still loading."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.appserver import free_port

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
LINES_TIMEOUT_S = 180

# Two loads at once in two threads while the main thread prints to both streams. Each load
# waits, inside the Python code around llama.cpp's model load (where a quiet mode would point the
# streams elsewhere), until the main thread has printed LINES lines before the C load and LINES
# after it: the prints overlap the loads by construction, on a fast machine or a busy one.
LINES = 5
PRINT_WHILE_LOADING = """
import sys, threading, time
import llama_cpp
from engine.backend import ModelConfig
from engine.llama.backend import LlamaBackend
from engine.llama.quiet import quiet_llama
LINES = int(sys.argv[2])
quiet_llama()
printed = 0
loaded = 0
said = threading.Condition()
real_load = llama_cpp.llama_model_load_from_file

def _after_lines():
    with said:
        start = printed
        said.wait_for(lambda: printed >= start + LINES)

def load(*args):
    global loaded
    _after_lines()
    model = real_load(*args)
    _after_lines()
    with said:
        loaded += 1
    return model

llama_cpp.llama_model_load_from_file = load
loads = [threading.Thread(target=lambda: LlamaBackend(ModelConfig(sys.argv[1], n_ctx=256,
                                                                  n_threads=1)).close())
         for _ in range(2)]
for t in loads:
    t.start()
while any(t.is_alive() for t in loads):
    print(f"out {printed}", flush=True)
    print(f"err {printed}", file=sys.stderr, flush=True)
    with said:
        printed += 1
        said.notify_all()
    time.sleep(0.001)
print(f"printed {printed} loaded {loaded}", flush=True)
"""


def test_model_loads_leave_the_process_streams_alone(embedded_paths):
    proc = subprocess.run([sys.executable, "-c", PRINT_WHILE_LOADING, str(embedded_paths[1]),
                           str(LINES)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *lines, last = proc.stdout.splitlines()
    _, n, _, loaded = last.split()
    n = int(n)
    # Both loads went through the wrapper, so at least 2 * LINES lines were printed during them.
    assert loaded == "2" and n >= 2 * LINES
    assert lines == [f"out {i}" for i in range(n)]
    # Every line, and nothing of llama.cpp's.
    assert proc.stderr.splitlines() == [f"err {i}" for i in range(n)]


# `tandem ui` with the pair's load held at a gate: until the gate file exists (the test never
# makes it), `execute` (models to derive and load, after the plan) waits, so the URL lines come
# while the models are still loading, on a fast machine or a busy one. Patched in the child, as
# above; the product has no such hook.
GATED_UI = """
import pathlib, sys, time
import app.runtime.open_pair as opening
gate = pathlib.Path(sys.argv[1])
real_execute = opening.execute

def execute(*args, **kwargs):
    while not gate.exists():
        time.sleep(0.05)
    return real_execute(*args, **kwargs)

opening.execute = execute
from app.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("api", [False, True], ids=["ui", "ui --api"])
def test_the_app_prints_its_url_while_the_models_load(embedded_paths, tmp_path, api):
    port = free_port()
    store = tmp_path / "store"
    gate = tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TANDEM_MODELS": str(store)}
    argv = [sys.executable, "-c", GATED_UI, str(gate), "ui", "--port", str(port), "--threads",
            "2", "--target", str(embedded_paths[0]), "--draft", str(embedded_paths[1])]
    url = f"http://127.0.0.1:{port}/"
    wanted = [f"Tandem is running at {url}  (Ctrl-C to stop)"]
    if api:
        argv.append("--api")
        wanted.append(f"OpenAI-compatible API at {url}v1")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout),
                     daemon=True).start()
    try:
        # A guard against a hang only: the lines come whatever the machine's speed.
        deadline = time.monotonic() + LINES_TIMEOUT_S
        while not all(w in lines for w in wanted):
            assert proc.poll() is None, "\n".join(lines)
            assert time.monotonic() < deadline, f"no URL lines in: {lines}"
            time.sleep(0.1)
        # Still loading: the gate holds the load, so nothing was derived into the store.
        assert not list(store.rglob("*.gguf"))
        if api:
            health = httpx.get(f"{url}health", timeout=10)
            assert health.status_code == 503 and health.json()["status"] == "loading"
        assert httpx.get(url, timeout=30).status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
