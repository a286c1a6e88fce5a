"""Loading a draft with a trimmed vocabulary (loading/derived/vocab_trim.py): the trimmed
file's backend wrapped with the source's embedding table and tokenizer
(engine/trimmed_backend.py), so it reads and scores every token of the source's vocabulary."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from engine.llama import backend as llama
from engine.backend import F32
from engine.trimmed_backend import EmbeddingBackend, Tokenizer, TrimmedBackend
from engine.errors import ModelFileError
from loading.derived.vocab_trim import kept_ids
from models.gguf_file import GGUFFile
from models.gguf_info import GGUFInfo


class EmbeddingTable:
    """Rows of a GGUF's `token_embd.weight`, dequantized on demand from the mapped file."""

    def __init__(self, model: GGUFInfo) -> None:
        self._file = GGUFFile(model)
        found = self._file.tensor("token_embd.weight")
        if found is None:
            raise ModelFileError(f"{model.path.name} has no token_embd.weight")
        self._type = gguf.GGMLQuantizationType(found.ggml_type)
        self._rows = self._file.rows(found)
        self.n_vocab = int(found.shape[1])
        self.n_embd = int(found.shape[0])

    def rows(self, tokens: Sequence[int]) -> F32:
        data = self._rows[np.asarray(tokens, dtype=np.int64)]
        out = gguf.quants.dequantize(data, self._type)
        return np.asarray(out, dtype=np.float32).reshape(len(tokens), self.n_embd)


def load_trimmed(source: GGUFInfo, trimmed: str | Path, inner: EmbeddingBackend,
                 vocab: Tokenizer | None = None) -> TrimmedBackend:
    """Wrap `inner` (the loaded trimmed file) with the embeddings and tokenizer of `source`
    (the untrimmed draft's header, read once by the load's plan)."""
    if vocab is None:
        vocab = llama.Vocabulary(source.path)
    return TrimmedBackend(inner, kept_ids(trimmed), EmbeddingTable(source), vocab)
