"""Registering RPC workers as llama.cpp devices (as llama.cpp's own `--rpc` does), through
ggml's backend registry in the libggml that libllama is linked to."""
from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp

from engine.rpc import WorkerError, probe_all

_REGISTERED: set[str] = set()


def add_rpc_workers(endpoints: Sequence[str]) -> None:
    """Register RPC workers, after probing each: llama.cpp aborts the process on a worker it
    cannot reach. Registered devices are offered to every model this process loads next, hence
    one process per RPC model (engine/isolated.py)."""
    if not llama_cpp.llama_supports_rpc():
        raise WorkerError("this llama-cpp-python was built without RPC; run scripts/run (or "
                          "scripts/test) to install the RPC build")
    for info in probe_all(endpoints):
        if info.devices == 0:
            raise WorkerError(f"RPC worker {info.endpoint} offers no device")
    ggml = ggml_lib()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    for endpoint in endpoints:
        if endpoint not in _REGISTERED:
            ggml.ggml_backend_register(add(endpoint.encode()))
            _REGISTERED.add(endpoint)


def ggml_lib() -> ctypes.CDLL:
    """The ggml registry functions, looked up through libllama's own handle: dlsym then finds
    the libggml that libllama is linked to. (llama_cpp._ggml loads the wheel's `libggml.so`, a
    separate copy of the file: a second registry that libllama never sees.)"""
    lib = llama_cpp.llama_cpp._lib
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    return lib
