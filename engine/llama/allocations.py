"""What llama.cpp allocated for a load, buffer by buffer, as it reports it itself.

llama.cpp logs every buffer it allocates, once, by its buffer's name (the device's: "Vulkan0",
"CUDA0", "MTL0"; the host's: "CPU", "CPU_Mapped", "Vulkan_Host"):

    load_tensors:      Vulkan0 model buffer size =   123.45 MiB      (weights)
    llama_kv_cache:    Vulkan0 KV buffer size =    12.00 MiB         (the KV cache)
    llama_context:     Vulkan0 compute buffer size =    45.67 MiB    (the graph's scratch)
    llama_context:  Vulkan_Host  output buffer size =     0.58 MiB   (the logits)

`capture_allocations()` listens to those lines while a model loads, so the offload plan can be
checked against what the load really took on each device (tests/test_vulkan_path.py). The
sizes are printed to 1/100 MiB, finer than any plan. llama.cpp's C++ `llama_get_memory_breakdown`
has the same figures but no C signature ctypes could call.
"""
from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import llama_cpp

from engine.llama.quiet import quiet_llama

MIB = 1 << 20
# What each logged kind is called in the plan (models/offload.py Placement).
KINDS = {"model": "weights", "KV": "kv", "compute": "compute", "output": "output"}
_LINE = re.compile(r"^\s*\w+:\s+(\S+)\s+(model|KV|compute|output)\s+buffer size =\s*([0-9.]+) MiB")


@dataclass
class Allocations:
    """The buffers loads allocated, in log order: (section, buffer name, kind, bytes). A
    section names the model being loaded (`mark`, e.g. from the loader's progress hook), so one
    capture around a pair's load tells the target's buffers from the draft's."""
    buffers: list[tuple[str, str, str, int]] = field(default_factory=list)
    section: str = ""

    def mark(self, section: str) -> None:
        """The allocations logged from now on belong to `section`."""
        self.section = section

    def on(self, buffer: str, section: str | None = None) -> dict[str, int]:
        """Bytes per kind ("weights", "kv", "compute", "output") on the buffer named `buffer`,
        in `section` (None: in all)."""
        out = dict.fromkeys(KINDS.values(), 0)
        for sec, name, kind, size in self.buffers:
            if name == buffer and section in (None, sec):
                out[kind] += size
        return out

    def names(self) -> list[str]:
        """The buffers' names, each once, in log order."""
        return list(dict.fromkeys(name for _, name, _, _ in self.buffers))

    def take(self, text: str) -> None:
        """Keeps a log line if it reports an allocation."""
        m = _LINE.match(text)
        if m:
            self.buffers.append((self.section, m.group(1), KINDS[m.group(2)],
                                 round(float(m.group(3)) * MIB)))


@contextmanager
def capture_allocations() -> Iterator[Allocations]:
    """Records the allocations llama.cpp logs inside the block; llama.cpp is quiet again after
    it (engine/llama/quiet.py), as every entry point leaves it."""
    found = Allocations()

    @llama_cpp.llama_log_callback
    def listen(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        found.take(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(listen, ctypes.c_void_p(0))
    try:
        yield found
    finally:
        quiet_llama()
