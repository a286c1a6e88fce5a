"""The backend of a draft with a trimmed vocabulary (derived by loading/derived/vocab_trim.py,
loaded by loading/derived/embeddings.py).

It looks like any backend with the source's full vocabulary: inputs are embedded from the
source's own `token_embd` table (so tokens the trimmed head dropped can still be read), and the
head's logits are scattered into a full-width row with -inf for every dropped token, which the
sampling transforms turn into q = 0. Tokenizer questions go to the source's vocabulary.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from engine.backend import F32, Part
from engine.errors import ModelFileError


class Embeddings(Protocol):
    """The source's input embedding table (loading/derived/embeddings.py reads it from the GGUF)."""
    n_vocab: int

    def rows(self, tokens: Sequence[int]) -> F32: ...


class EmbeddingBackend(Protocol):
    n_vocab: int
    n_ctx: int
    n_batch: int
    name: str

    n_seq: int

    def decode_embeddings(self, embd: F32, pos: int, rows: Sequence[int],
                          seq: int = 0) -> F32: ...

    def decode_embeddings_batch(self, embd: F32, parts: Sequence[Part]) -> list[F32]: ...

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str: ...

    def truncate(self, n: int, seq: int = 0) -> None: ...

    def close(self) -> None: ...


class Tokenizer(Protocol):
    def tokenize(self, data: bytes) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def close(self) -> None: ...


class TrimmedBackend:
    def __init__(self, inner: EmbeddingBackend, ids: np.ndarray, table: Embeddings,
                 vocab: Tokenizer) -> None:
        if len(ids) != inner.n_vocab:
            raise ModelFileError(f"{inner.name}: {len(ids)} kept ids for a head of "
                                 f"{inner.n_vocab} tokens")
        self.inner = inner
        self.ids = np.asarray(ids, dtype=np.int64)
        self.table = table
        self.vocab = vocab
        self.n_vocab: int = table.n_vocab
        self.n_ctx: int = inner.n_ctx
        self.n_batch: int = inner.n_batch
        self.n_seq: int = inner.n_seq
        self.name = inner.name

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return self.vocab.piece(token)

    def is_eog(self, token: int) -> bool:
        return self.vocab.is_eog(token)

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        return self.inner.chat_prompt(messages, tools)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int], seq: int = 0) -> F32:
        return self._full(self.inner.decode_embeddings(self.table.rows(tokens), pos, rows, seq))

    def decode_batch(self, parts: Sequence[Part]) -> list[F32]:
        embd = self.table.rows([t for p in parts for t in p.tokens])
        return [self._full(kept) for kept in self.inner.decode_embeddings_batch(embd, parts)]

    def _full(self, kept: F32) -> F32:
        """Rows of the trimmed head as rows of the full vocabulary (-inf where dropped)."""
        out = np.full((len(kept), self.n_vocab), -np.inf, dtype=np.float32)
        out[:, self.ids] = kept
        return out

    def truncate(self, n: int, seq: int = 0) -> None:
        self.inner.truncate(n, seq)

    def close(self) -> None:
        self.inner.close()
        self.vocab.close()
