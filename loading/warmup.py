"""Warm-up at load, as llama-server does it (common/common.cpp, `--no-warmup` to skip): one
decode of one token on each model just loaded, then its KV cache cleared. The first request
then no longer pays the device's start-up: on a GPU its first graph's buffers and kernels, on
the CPU the weights' pages read in from the memory-mapped file and the repacked copies made.
"""
from __future__ import annotations

from engine.backend import Backend


def warm_up(backend: Backend) -> None:
    """Decode one token at position 0 (the model's BOS, else token 0) and forget it."""
    tokens = backend.tokenize("", add_special=True)[:1] or [0]
    backend.decode(tokens, 0, [0])
    backend.truncate(0)
