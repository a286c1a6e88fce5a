"""The bounds of what Tandem hands to llama.cpp: hardware settings and the fit of a prompt.

llama.cpp does not report a bad setting or an oversized batch as an error: it aborts the process
(`GGML_ASSERT(n_tokens_all <= cparams.n_batch)` took down `tandem generate --ctx 16`). So every
setting is checked here before a model loads, and every decode is checked against the context's
real limits before the call (engine/llama/backend.py, engine/session.py).
"""
from __future__ import annotations

from engine.errors import PromptTooLongError, SettingsError

# llama.cpp refuses smaller contexts in practice (a chat template alone needs more).
MIN_CTX = 16
# llama.cpp's context, batch and position fields are 32-bit; larger values wrap around in ctypes.
MAX_INT32 = 2**31 - 1
# ggml's GGML_MAX_N_THREADS: a thread pool larger than this is an assert inside ggml.
MAX_THREADS = 512


def check_hardware(n_ctx: int, n_threads: int | None, n_gpu_layers: int | None,
                   n_batch: int) -> None:
    """Refuse hardware settings llama.cpp cannot take; documented meanings pass (threads None:
    every core; gpu layers None: auto, -1: all of them, and any count above the model's layers
    is all)."""
    if not (MIN_CTX <= n_ctx <= MAX_INT32):
        raise SettingsError(f"context length must be between {MIN_CTX} and {MAX_INT32}, got {n_ctx}")
    if n_threads is not None and not (1 <= n_threads <= MAX_THREADS):
        raise SettingsError(f"threads must be between 1 and {MAX_THREADS} (leave it out to use "
                            f"every core), got {n_threads}")
    if n_gpu_layers is not None and not (-1 <= n_gpu_layers <= MAX_INT32):
        raise SettingsError(f"GPU layers must be >= 0 (-1 puts every layer on the GPU), "
                            f"got {n_gpu_layers}")
    if not (1 <= n_batch <= MAX_INT32):
        raise SettingsError(f"batch size must be >= 1, got {n_batch}")


def check_ctx_trained(n_ctx: int, n_ctx_train: int, name: str) -> None:
    """A context longer than the model was trained for is refused (0: the file does not say)."""
    if n_ctx_train > 0 and n_ctx > n_ctx_train:
        raise SettingsError(f"context length {n_ctx} is more than {name} was trained for "
                            f"({n_ctx_train}); use --ctx {n_ctx_train} or less")


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    """A prompt must leave at least one position for the answer."""
    if n_prompt + 1 > n_ctx:
        room = " with no room for an answer" if n_prompt == n_ctx else ""
        raise PromptTooLongError(f"the prompt needs {n_prompt} tokens, the context holds "
                            f"{n_ctx}{room}; raise --ctx")
