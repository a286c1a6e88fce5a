"""Loading a draft with a trimmed vocabulary (loading/derived/vocab_trim.py): the trimmed
file's backend wrapped with the source's embedding table and tokenizer
(engine/trimmed_backend.py), so it reads and scores every token of the source's vocabulary."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from engine import llama_backend
from engine.backend import F32
from engine.trimmed_backend import EmbeddingBackend, Tokenizer, TrimmedBackend
from engine.errors import ModelFileError
from loading.derived.vocab_trim import kept_ids


class EmbeddingTable:
    """Rows of a GGUF's `token_embd.weight`, dequantized on demand from the mapped file."""

    def __init__(self, path: str | Path) -> None:
        reader = gguf.GGUFReader(str(path))
        found = [t for t in reader.tensors if t.name == "token_embd.weight"]
        if not found:
            raise ModelFileError(f"{Path(path).name} has no token_embd.weight")
        self._tensor = found[0]
        self.n_vocab = int(self._tensor.shape[1])
        self.n_embd = int(self._tensor.shape[0])

    def rows(self, tokens: Sequence[int]) -> F32:
        data = self._tensor.data[np.asarray(tokens, dtype=np.int64)]
        out = gguf.quants.dequantize(data, self._tensor.tensor_type)
        return np.asarray(out, dtype=np.float32).reshape(len(tokens), self.n_embd)


def load_trimmed(source: str | Path, trimmed: str | Path, inner: EmbeddingBackend,
                 vocab: Tokenizer | None = None) -> TrimmedBackend:
    """Wrap `inner` (the loaded trimmed file) with `source`'s embeddings and tokenizer."""
    if vocab is None:
        vocab = llama_backend.Vocabulary(source)
    return TrimmedBackend(inner, kept_ids(trimmed), EmbeddingTable(source), vocab)
