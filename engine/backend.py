"""The small interface every model backend offers; only engine/llama/ talks to llama.cpp.

A backend is one model with one KV cache holding `n_seq` sequences, each with its own range of
positions (sequence 0 unless told otherwise). It knows nothing of positions beyond what it is
told: the `Session` that owns a sequence decides where its tokens go and when to roll back.
`decode_batch` decodes several sequences' tokens in one model call (engine/batch_step.py
gathers them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import numpy.typing as npt

from engine.attention import DEFAULT_FLASH_ATTN, DEFAULT_KV_TYPE, check_attention
from engine.errors import SettingsError
from engine.limits import check_hardware

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ModelConfig:
    """Hardware settings for one model; target and draft each get their own."""

    path: str
    n_ctx: int = 4096
    n_threads: int | None = None
    # Layers on the GPU, as llama.cpp's -ngl: a number (-1: all), or None, "auto": the loading
    # plan places them (loading/plan.py); a backend built without a plan keeps them on the CPU.
    n_gpu_layers: int | None = None
    n_batch: int = 512
    # GGUF LoRA adapters applied on load, each (path, scale) (loading/adapters.py).
    lora: tuple[tuple[str, float], ...] = ()
    # RPC workers ("host:port", engine/rpc.py) holding this model's layers; empty: all local.
    rpc: tuple[str, ...] = ()
    # Sequences the KV cache holds, each up to n_ctx positions (engine/slots.py decodes them
    # together; llama.cpp's n_seq_max, the KV cache sized for all of them).
    n_seq: int = 1
    # What messages and the API call the model (a name like "qwen2.5-coder:7b" when it was
    # chosen by name); empty: the file name.
    name: str = ""
    # Flash attention "auto", "on" or "off", and the KV cache's type (engine/attention.py).
    flash_attn: str = DEFAULT_FLASH_ATTN
    kv_type: str = DEFAULT_KV_TYPE

    def __post_init__(self) -> None:
        check_hardware(self.n_ctx, self.n_threads, self.n_gpu_layers, self.n_batch)
        check_attention(self.flash_attn, self.kv_type)
        if self.n_seq < 1:
            raise SettingsError(f"sequences per model must be >= 1, got {self.n_seq}")


@dataclass(frozen=True)
class Part:
    """One sequence's share of a batched decode: `tokens` appended to sequence `seq` at
    positions pos.., with logits wanted for the indices `rows` into `tokens`."""

    seq: int
    tokens: Sequence[int]
    pos: int
    rows: Sequence[int]


@dataclass(frozen=True)
class TokenTable:
    """Every token's bytes, for a grammar engine's tokenizer (engine/grammar/llg.py): a control
    token (an end-of-turn marker, a tool-call tag the model treats as special) as its text and
    flagged in `control`, so no grammar literal can be spelled with it; `eos` is the
    end-of-generation token a finished grammar allows."""

    pieces: tuple[bytes, ...]
    control: frozenset[int]
    eos: int


class Backend(Protocol):
    n_vocab: int
    n_ctx: int
    # The most tokens one decode call takes (0: no limit); `Session` splits longer batches.
    n_batch: int
    name: str
    # Sequences the cache holds (sequence ids 0..n_seq-1), each up to n_ctx positions.
    n_seq: int

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; `add_special` adds BOS where the model wants one."""

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a multi-byte UTF-8 character)."""

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and the like."""

    def token_table(self) -> TokenTable:
        """Every token's bytes and which are control tokens (built once, then cached)."""

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        """Render messages with the chat template stored in the model, ready for generation;
        `tools` (OpenAI's `tools` entries) go to the template as its `tools` variable, as
        Hugging Face's apply_chat_template passes them (a template that does not read them
        renders as without)."""

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        """Append `tokens` to sequence `seq` at positions pos.. and return logits
        `[len(rows), n_vocab]` for the given indices into `tokens` (only those rows are
        computed and copied)."""

    def decode_batch(self, parts: Sequence[Part]) -> list[F32]:
        """Decode every part (each of a different sequence) in one batch, split only where it
        exceeds n_batch; each part's logit rows, in order. A failure leaves whatever reached
        the caches there (each part's session truncates it away)."""

    def truncate(self, n: int, seq: int = 0) -> None:
        """Forget every position >= n of sequence `seq`."""

    def close(self) -> None:
        """Free the model and its context."""
