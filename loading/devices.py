"""This machine as the offload plan sees it: its RAM, and the GPUs llama.cpp's own device
registry reports (engine/llama/devices.py), with one line on why there is none."""
from __future__ import annotations

from engine.llama import devices as registry
from models.machine import Gpu, Machine, with_gpus
from models.offload import GPU_BUILD_HINT


def detect() -> Machine:
    """RAM and the GPUs this llama.cpp can place layers on, free memory as it reports it."""
    found = registry.gpus()
    if found:
        return with_gpus([Gpu(d.description or d.name, d.free, d.total, d.unified, d.max_tensor)
                          for d in found])
    backends = registry.gpu_backends()
    if backends:
        return with_gpus([], f"llama.cpp's {', '.join(backends)} backend finds no device")
    return with_gpus([], f"this llama.cpp is built for the CPU only; {GPU_BUILD_HINT}")
