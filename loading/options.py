"""What a load checks and derives: the one options object the app hands to `load_pair`."""
from __future__ import annotations

from dataclasses import dataclass

DRAFT_VOCAB_CHOICES = ("full", "trim")


@dataclass(frozen=True)
class LoadOptions:
    check_compat: bool = True
    check_budget: bool = True
    # Derive and load the early-exit drafter too (it is another llama.cpp model, so opt-in);
    # `early_exit_layers` None means three quarters of the target's layers.
    early_exit: bool = False
    early_exit_layers: int | None = None
    # The draft as loaded: "auto" requantizes a heavy draft that runs on the CPU to Q4_0
    # (loading/derived/quantized.py), "q4_0" always, "off" uses the file as given.
    draft_quant: str = "auto"
    # "trim" loads the draft with a trimmed output vocabulary (loading/derived/vocab_trim.py):
    # cheaper per token on a CPU, at some acceptance; "full" as given.
    draft_vocab: str = "full"
    # Decode one token on each model at load and forget it (loading/warmup.py), as llama-server
    # does unless --no-warmup: the first request then does not pay the device's start-up.
    warmup: bool = True

    @property
    def wants_early_exit(self) -> bool:
        return self.early_exit or self.early_exit_layers is not None

