"""What a report says about where and how it was made: date, command line, machine."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction sets that change llama.cpp's kernels and numpy's loops, in the order printed.
SIMD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512vbmi", "avx_vnni", "amx_tile", "neon", "asimd")


def cpu_flags() -> list[str]:
    """The SIMD flags of this CPU (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in have]
    except OSError:
        pass
    return []


def _cpu_family() -> str:
    """'family F model M' (x86 Linux): tells apart CPUs sold under one name, as AMD EPYCs are."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model") and key not in found:
                    found[key] = value.strip()
                if len(found) == 2:
                    return f"family {found['cpu family']} model {found['model']}"
    except OSError:
        pass
    return ""


def machine_line() -> str:
    """CPU model, logical CPUs and SIMD flags: what every figure is printed beside."""
    family = _cpu_family()
    return (f"{_cpu_model()}{f' ({family})' if family else ''}, {os.cpu_count()} logical CPUs, "
            f"flags {' '.join(cpu_flags()) or 'unknown'}")


def command_line(words: list[str]) -> str:
    return "tandem " + " ".join(shlex.quote(w) for w in words)


def run_context(command: str) -> dict:
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "machine": f"{platform.system()} {platform.machine()}, {_cpu_model()}, "
                   f"{os.cpu_count()} logical CPUs",
        "python": platform.python_version(),
    }
