"""Every entry point loads llama.cpp's libraries before numpy (engine/llama/load_first.py: on a
CUDA build the other order crashed the model load). Python's audit hooks see both events: the
`import` of numpy and the `ctypes.dlopen` of libllama."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_WATCH = """
import sys
seen = []
def hook(event, args):
    if event == "import" and args[0] == "numpy":
        seen.append("numpy")
    elif event == "ctypes.dlopen" and "libllama" in str(args[0]):
        seen.append("libllama")
sys.addaudithook(hook)
import {module}
print(",".join(dict.fromkeys(seen)))
"""


def _order(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _WATCH.format(module=module)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1].split(",")


@pytest.mark.parametrize("module", ["app.cli", "scripts.gpu_check", "scripts.screenshots"])
def test_the_entry_point_loads_llama_cpp_before_numpy(module):
    assert _order(module)[:2] == ["libllama", "numpy"]


def test_the_check_sees_the_wrong_order():
    # The negative control: a module importing numpy first is caught.
    assert _order("numpy, engine.llama.load_first")[:2] == ["numpy", "libllama"]
