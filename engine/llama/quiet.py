"""Keeping llama.cpp quiet: its log messages are progress and diagnostics, and every failure it
reports through a return value becomes Tandem's own one-line error, so none is shown.

`quiet_llama()` sends the messages to a callback that drops them; the entry points (the
`tandem` command, the isolated backend's worker process) call it before loading a model. The
process's streams are never touched: pointing file descriptors 1 and 2 at /dev/null during a
load, as llama-cpp-python's quiet mode does, lost whatever other threads printed meanwhile.
Tandem does not go through llama-cpp-python's `Llama`, so that mode is never entered.
"""
from __future__ import annotations

import ctypes

import llama_cpp


@llama_cpp.llama_log_callback
def _drop_llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log callback: drops every message."""


def quiet_llama() -> None:
    """Send llama.cpp's (and ggml's) log messages to `_drop_llama_log`. Idempotent."""
    llama_cpp.llama_log_set(_drop_llama_log, ctypes.c_void_p(0))
