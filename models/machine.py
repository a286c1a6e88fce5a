"""How much memory this machine offers: RAM (psutil), NVIDIA VRAM (nvidia-smi), Apple unified memory."""
from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

# Metal lets one process wire only part of unified memory (recommendedMaxWorkingSetSize is about
# three quarters of RAM on current Macs).
METAL_SHARE = 0.75


@dataclass(frozen=True)
class Machine:
    ram_total: int
    ram_available: int
    gpu_name: str | None = None
    gpu_free: int = 0
    gpu_total: int = 0
    unified: bool = False
    cpu_repacks: bool = False

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


def detect() -> Machine:
    vm = psutil.virtual_memory()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return Machine(vm.total, vm.available, "Apple GPU (Metal)", int(vm.total * METAL_SHARE),
                       int(vm.total * METAL_SHARE), unified=True)
    gpu = _nvidia()
    if gpu:
        return Machine(vm.total, vm.available, gpu[0], gpu[1], gpu[2], cpu_repacks=_cpu_repacks())
    return Machine(vm.total, vm.available, cpu_repacks=_cpu_repacks())
