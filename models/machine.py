"""How much memory this machine offers: RAM (psutil) and its GPU, as the budget and the offload plan see it.

The GPU is what llama.cpp's own device registry reports (engine/llama/devices.py, turned into a
`Machine` by loading/devices.py); `detect` here is the fallback of the models layer, which may
not ask llama.cpp: nvidia-smi, or Metal's share of an Apple Silicon Mac's unified memory.
`what_if` describes a machine a user asks about (`tandem budget --gpu-memory 8GiB`).
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

from engine.errors import SettingsError

# Metal lets one process wire only part of unified memory (recommendedMaxWorkingSetSize is about
# three quarters of RAM on current Macs).
METAL_SHARE = 0.75
# Memory left free on each GPU, as llama.cpp's `--fit` does by default (1 GiB per device): the
# driver, the display and allocations llama.cpp makes outside its estimate live there.
GPU_MARGIN = 1 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Machine:
    ram_total: int
    ram_available: int
    gpu_name: str | None = None
    gpu_free: int = 0
    gpu_total: int = 0
    unified: bool = False
    cpu_repacks: bool = False
    # Left free on the GPU (GPU_MARGIN per device), and why there is no GPU to plan for when
    # there is none ("" when nothing needs saying).
    gpu_margin: int = GPU_MARGIN
    gpu_note: str = ""
    # The largest weight the GPU takes in a matrix product (0: no limit found); a larger output
    # matrix stays on the CPU, as llama.cpp places it (engine/llama/devices.py largest_tensor).
    gpu_max_tensor: int = 0
    # Each GPU where there are several (llama.cpp splits the offloaded layers over them and
    # puts the output on the last: models/budget.py `device_bytes`); empty for one or none.
    gpus: tuple["Gpu", ...] = ()

    @property
    def gpu_room(self) -> int:
        """What the plan may fill on the GPU: its free memory less the margin."""
        return max(0, self.gpu_free - self.gpu_margin) if self.has_gpu else 0

    @property
    def has_gpu(self) -> bool:
        return self.gpu_name is not None

    def describe(self) -> str:
        gib = 1 << 30
        ram = f"RAM {self.ram_available / gib:.1f} of {self.ram_total / gib:.1f} GiB free"
        if self.unified:
            return f"{ram}; {self.gpu_name} shares it (unified memory, up to {self.gpu_free / gib:.1f} GiB for Metal)"
        if self.has_gpu:
            return f"{ram}; {self.gpu_name} {self.gpu_free / gib:.1f} of {self.gpu_total / gib:.1f} GiB free"
        return f"{ram}; no GPU"


def _nvidia() -> tuple[str, int, int] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.free,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # llama.cpp splits across GPUs, but one device is the safe assumption for a desktop app.
    rows = [r.split(",") for r in out.strip().splitlines() if r.count(",") == 2]
    if not rows:
        return None
    name, free, total = max(rows, key=lambda r: int(r[1]))
    return name.strip(), int(free) << 20, int(total) << 20


def _cpu_repacks() -> bool:
    """Whether llama.cpp's CPU backend keeps repacked copies of Q4_0/Q4_K/IQ4_NL weights (AVX2 or ARM dotprod)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        try:
            return " avx2 " in f" {Path('/proc/cpuinfo').read_text().split('flags', 1)[1].split(chr(10), 1)[0]} "
        except (OSError, IndexError):
            return False
    return machine in ("arm64", "aarch64") and platform.system() != "Darwin"


@dataclass(frozen=True)
class Gpu:
    """One GPU as llama.cpp reports it; `unified` when it draws on the host's memory (Apple
    Silicon, integrated GPUs)."""
    name: str
    free: int
    total: int
    unified: bool = False
    max_tensor: int = 0


def with_gpus(gpus: Sequence[Gpu], note: str = "") -> Machine:
    """This machine's RAM with the GPUs llama.cpp reports. Several GPUs are pooled for the
    totals and each is checked on its own (models/budget.py `device_bytes`): llama.cpp splits
    the offloaded layers over them in proportion to their free memory, the output on the last;
    each keeps its own margin. `note` says why there is none."""
    vm = psutil.virtual_memory()
    if not gpus:
        return Machine(vm.total, vm.available, cpu_repacks=_cpu_repacks(), gpu_note=note)
    name = gpus[0].name if len(gpus) == 1 else f"{len(gpus)} GPUs ({', '.join(g.name for g in gpus)})"
    limits = [g.max_tensor for g in gpus if g.max_tensor]
    return Machine(vm.total, vm.available, name, sum(g.free for g in gpus),
                   sum(g.total for g in gpus), unified=any(g.unified for g in gpus),
                   cpu_repacks=_cpu_repacks(), gpu_margin=GPU_MARGIN * len(gpus), gpu_note=note,
                   gpu_max_tensor=min(limits, default=0), gpus=tuple(gpus) if len(gpus) > 1 else ())


def detect() -> Machine:
    """The fallback guess of the models layer (nvidia-smi, Metal's share of unified memory),
    for callers that do not ask llama.cpp (loading/devices.py does)."""
    vm = psutil.virtual_memory()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Machine(vm.total, vm.available, "Apple GPU (Metal)", int(vm.total * METAL_SHARE),
                       int(vm.total * METAL_SHARE), unified=True)
    gpu = _nvidia()
    if gpu:
        return Machine(vm.total, vm.available, gpu[0], gpu[1], gpu[2], cpu_repacks=_cpu_repacks())
    return Machine(vm.total, vm.available, cpu_repacks=_cpu_repacks())


def physical_cores() -> int:
    """Cores without their hyperthreads: llama.cpp's default thread count (-t)."""
    return max(1, psutil.cpu_count(logical=False) or psutil.cpu_count() or 1)


def parse_size(text: str) -> int:
    """Bytes of a size like "8GiB", "8 GB", "8G" or "512MiB". GPUs are sold in binary units
    (an "8 GB" card holds 8 GiB), so GB and GiB are both 2**30."""
    m = _SIZE.match(text)
    if not m:
        raise SettingsError(f"cannot read {text!r} as a memory size; write it like 8GiB or 512MiB")
    value = float(m.group(1)) * (1 << (10 * " KMGT".index((m.group(2) or " ").upper())))
    if value <= 0:
        raise SettingsError(f"a memory size must be positive, got {text!r}")
    return int(value)


def what_if(base: Machine, gpu_memory: int | None = None,
            unified_memory: int | None = None) -> Machine:
    """`base` with the GPU a user asks about: a discrete card of `gpu_memory` bytes (all of it
    free), or an Apple Silicon Mac with `unified_memory` bytes in all (Metal may use
    METAL_SHARE of them; RAM and GPU then draw on the same memory)."""
    if gpu_memory is not None and unified_memory is not None:
        raise SettingsError("ask about one device: --gpu-memory (a discrete card) or "
                            "--unified-memory (Apple Silicon), not both")
    gib = 1 << 30
    if gpu_memory is not None:
        return Machine(base.ram_total, base.ram_available, f"{gpu_memory / gib:g} GiB GPU (what-if)",
                       gpu_memory, gpu_memory, cpu_repacks=base.cpu_repacks)
    if unified_memory is not None:
        metal = int(unified_memory * METAL_SHARE)
        return Machine(unified_memory, unified_memory,
                       f"{unified_memory / gib:g} GiB Apple Silicon Mac (what-if, Metal)", metal, metal,
                       unified=True)
    return base
