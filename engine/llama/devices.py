"""The devices llama.cpp can place layers on, as its own device registry reports them.

ggml's registry (`ggml_backend_dev_count`, `ggml_backend_dev_get`, `ggml_backend_dev_get_props`)
answers alike for CUDA, Metal, Vulkan, ROCm and SYCL builds: each device's name, description,
type and free and total memory. Its functions are looked up through libllama's own handle, so
dlsym finds the libggml libllama is linked to (llama_cpp._ggml loads a second copy of the file,
a registry libllama never sees). RPC workers registered for an earlier load are devices of
that registry too; they are the workers' memory, planned apart (models/budget.py
`estimate_rpc`), so `gpus` leaves them out.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

# enum ggml_backend_dev_type (ggml-backend.h), by value.
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


class _Caps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool),
                ("buffer_from_host_ptr", ctypes.c_bool), ("events", ctypes.c_bool)]


class _Props(ctypes.Structure):
    """struct ggml_backend_dev_props."""
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p),
                ("memory_free", ctypes.c_size_t), ("memory_total", ctypes.c_size_t),
                ("type", ctypes.c_int), ("device_id", ctypes.c_char_p), ("caps", _Caps)]


@dataclass(frozen=True)
class Device:
    """One device of llama.cpp's registry: `kind` is "gpu" (dedicated memory), "igpu" (an
    integrated GPU in host memory), "cpu" or "accel"; `backend` its registry's name ("CUDA",
    "Metal", "Vulkan", "RPC", ...)."""
    name: str
    description: str
    kind: str
    backend: str
    free: int
    total: int


def _lib() -> ctypes.CDLL:
    lib = llama_cpp.llama_cpp._lib
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get_props.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Props)]
    lib.ggml_backend_dev_get_props.restype = None
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_count.argtypes = []
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    return lib


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""


def devices() -> list[Device]:
    """Every device in llama.cpp's registry, in its order."""
    lib = _lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        props = _Props()
        lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        kind = DEVICE_TYPES[props.type] if 0 <= props.type < len(DEVICE_TYPES) else "other"
        out.append(Device(_text(props.name), _text(props.description), kind,
                          _text(lib.ggml_backend_reg_name(reg)) if reg else "",
                          int(props.memory_free), int(props.memory_total)))
    return out


def backends() -> list[str]:
    """The backends this llama.cpp was built with, by their registry names ("CPU", "CUDA",
    "Metal", "Vulkan", "RPC", "BLAS", ...)."""
    lib = _lib()
    return [_text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
            for i in range(lib.ggml_backend_reg_count())]


# Backends that add no device to offload layers to (RPC's devices are other machines').
HOST_BACKENDS = ("CPU", "RPC", "BLAS")


def gpu_backends() -> list[str]:
    """The backends of this build that place layers on a GPU; none for a CPU-only build
    (`llama_supports_gpu_offload` also says yes for an RPC build, so it cannot tell)."""
    return [b for b in backends() if b not in HOST_BACKENDS]


def gpus() -> list[Device]:
    """The devices llama.cpp offloads layers to (GPUs, integrated or not), RPC workers left out."""
    return [d for d in devices() if d.kind in ("gpu", "igpu") and d.backend not in HOST_BACKENDS]
