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
# The Metal backend's registry name (ggml-metal.cpp GGML_METAL_NAME). Its device says "gpu", not
# "igpu", though on Apple Silicon it draws on the host's memory.
METAL = "MTL"


class _Caps(ctypes.Structure):
    """struct ggml_backend_dev_caps (five bools in the ggml of llama-cpp-python 0.3.36)."""
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool),
                ("buffer_from_host_ptr", ctypes.c_bool), ("events", ctypes.c_bool),
                ("mmap_support", ctypes.c_bool)]


class _Props(ctypes.Structure):
    """struct ggml_backend_dev_props."""
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p),
                ("memory_free", ctypes.c_size_t), ("memory_total", ctypes.c_size_t),
                ("type", ctypes.c_int), ("device_id", ctypes.c_char_p), ("caps", _Caps)]


@dataclass(frozen=True)
class Device:
    """One device of llama.cpp's registry: `kind` is "gpu" (dedicated memory), "igpu" (an
    integrated GPU in host memory), "cpu" or "accel"; `backend` its registry's name ("CUDA",
    "MTL" (Metal), "Vulkan", "RPC", ...)."""
    name: str
    description: str
    kind: str
    backend: str
    free: int
    total: int
    # The PCI bus id where the backend knows it ("" if not): one card seen by two backends.
    device_id: str = ""
    # The largest weight matrix a matrix product may take there, in bytes; 0 when no size up to
    # the device's memory is refused (`largest_tensor`).
    max_tensor: int = 0

    @property
    def unified(self) -> bool:
        """Whether it draws on the host's memory: an integrated GPU, or Metal (Apple Silicon;
        its free memory is recommendedMaxWorkingSetSize less what is allocated)."""
        return self.kind == "igpu" or self.backend == METAL


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
    lib.ggml_init.argtypes = [_InitParams]
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    lib.ggml_free.restype = None
    lib.ggml_tensor_overhead.argtypes = []
    lib.ggml_tensor_overhead.restype = ctypes.c_size_t
    lib.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.ggml_new_tensor_2d.restype = ctypes.c_void_p
    lib.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.ggml_mul_mat.restype = ctypes.c_void_p
    lib.ggml_backend_dev_supports_op.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.ggml_backend_dev_supports_op.restype = ctypes.c_bool
    return lib


class _InitParams(ctypes.Structure):
    """struct ggml_init_params."""
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


# enum ggml_type GGML_TYPE_F32, and the width of the probe's matrix (its rows are
# PROBE_ROW_BYTES each).
_F32 = 0
_PROBE_K = 4096
PROBE_ROW_BYTES = _PROBE_K * 4
# Sizes below this are not probed: a device refusing them refuses f32 products outright.
_PROBE_FLOOR = 1 << 20


def largest_tensor(lib: ctypes.CDLL, dev: int, total: int) -> int:
    """The largest weight (bytes, to PROBE_ROW_BYTES) of a matrix product the device accepts, as
    llama.cpp asks it when it places each weight (llama-model.cpp weight_buft_supported:
    `ggml_backend_dev_supports_op`); 0 when it accepts every size up to `total`, or refuses
    even a small one (an answer about the type, not the size).

    Worked example: Mesa's lavapipe limits a storage buffer to 128 MiB
    (maxStorageBufferRange), so ggml-vulkan refuses Gemma 3 270M's 170 MiB tied output matrix,
    which llama.cpp then keeps on the CPU with the logits' compute buffer: 134_217_728 here.
    Binary search over the rows of an f32 [4096, rows] weight, on tensors never allocated."""
    ctx = lib.ggml_init(_InitParams(64 * lib.ggml_tensor_overhead(), None, True))
    try:
        x = lib.ggml_new_tensor_2d(ctx, _F32, _PROBE_K, 1)

        def takes(rows: int) -> bool:
            w = lib.ggml_new_tensor_2d(ctx, _F32, _PROBE_K, rows)
            return bool(lib.ggml_backend_dev_supports_op(dev, lib.ggml_mul_mat(ctx, w, x)))

        lo, hi = _PROBE_FLOOR // PROBE_ROW_BYTES, max(1, total // PROBE_ROW_BYTES)
        if hi <= lo or not takes(lo) or takes(hi):
            return 0
        while hi - lo > 1:  # takes(lo), not takes(hi): about 20 probes for a 24 GiB card
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if takes(mid) else (lo, mid)
        return lo * PROBE_ROW_BYTES
    finally:
        lib.ggml_free(ctx)


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
        backend = _text(lib.ggml_backend_reg_name(reg)) if reg else ""
        # Only offload targets are probed: the CPU and RPC workers place no weight by it.
        limit = largest_tensor(lib, dev, int(props.memory_total)) if (
            kind in ("gpu", "igpu") and backend not in HOST_BACKENDS) else 0
        out.append(Device(_text(props.name), _text(props.description), kind, backend,
                          int(props.memory_free), int(props.memory_total), _text(props.device_id),
                          limit))
    return out


def backends() -> list[str]:
    """The backends this llama.cpp was built with, by their registry names ("CPU", "CUDA",
    "MTL" (Metal), "Vulkan", "RPC", "BLAS", ...)."""
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
    return offload_targets(devices())


def offload_targets(found: list[Device]) -> list[Device]:
    """The GPUs of `found` a load uses, chosen as llama.cpp chooses them (llama.cpp
    llama_model_load): each dedicated GPU once (a card two backends see shares its device id),
    RPC workers left out; integrated GPUs only where there is no dedicated one, and only those
    of the first one's backend."""
    cards: list[Device] = []
    for d in found:
        if d.kind == "gpu" and d.backend not in HOST_BACKENDS and not (
                d.device_id and any(c.device_id == d.device_id for c in cards)):
            cards.append(d)
    if cards:
        return cards
    igpus = [d for d in found if d.kind == "igpu" and d.backend not in HOST_BACKENDS]
    return [d for d in igpus if d.backend == igpus[0].backend]
