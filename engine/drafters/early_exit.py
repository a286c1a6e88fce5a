"""Self-speculative early exit: a draft made of the target's own first k layers and output head.

The engine sees it as one more draft model; its GGUF is derived from the target's at load
(loading/derived/early_exit.py).
"""
from __future__ import annotations

from engine.backend import Backend
from engine.drafters.draft_model import DraftModelDrafter


def early_exit_drafter(backend: Backend, p_min: float = 0.0,
                       chain_min: float = 0.0) -> DraftModelDrafter:
    """A draft-model drafter over the derived backend, reporting itself as 'early-exit'."""
    drafter = DraftModelDrafter(backend, p_min=p_min, chain_min=chain_min)
    drafter.name = "early-exit"
    return drafter
