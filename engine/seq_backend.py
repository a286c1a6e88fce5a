"""One sequence of a shared backend, as a backend of its own: its decodes go into the batch of
the next step (engine/batch_step.py), with every other sequence's, and its truncations touch its
own positions only. A `Session` over it owns that sequence's positions as it owns a whole
backend's; tokenizer questions go to the shared backend."""
from __future__ import annotations

from typing import Sequence

from engine.backend import F32, Backend, Part, TokenTable
from engine.batch_step import BatchStep


class SeqBackend:
    def __init__(self, shared: Backend, seq: int, step: BatchStep) -> None:
        if not 0 <= seq < shared.n_seq:
            raise ValueError(f"sequence {seq} is outside the {shared.n_seq} {shared.name} holds")
        self.shared = shared
        self.seq = seq
        self.step = step
        self.n_vocab = shared.n_vocab
        self.n_ctx = shared.n_ctx
        self.n_batch = shared.n_batch
        self.name = shared.name
        # A sequence is one sequence.
        self.n_seq = 1

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.shared.tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.shared.token_bytes(token)

    def is_eog(self, token: int) -> bool:
        return self.shared.is_eog(token)

    def token_table(self) -> TokenTable:
        return self.shared.token_table()

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        return self.shared.chat_prompt(messages, tools)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        return self.step.decode(self.shared, Part(self.seq, tokens, pos, rows))

    def decode_batch(self, parts: Sequence[Part]) -> list[F32]:
        return [self.decode(p.tokens, p.pos, p.rows) for p in parts]

    def truncate(self, n: int, seq: int = 0) -> None:
        self.step.truncate(self.shared, n, self.seq)

    def close(self) -> None:
        """Free the sequence's positions; the shared backend stays with its owner."""
        self.truncate(0)
