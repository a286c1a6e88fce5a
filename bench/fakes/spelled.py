"""Instant backends that spell text with a real vocabulary, so a grammar compiles for them
(llguidance forces canonical tokenizations through `tokenize`): the Qwen2.5 vocabulary of a GGUF
file, or a byte-level table padded to any size."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from bench.fakes.instant import InstantBackend
from engine.backend import TokenTable
from engine.llama.backend import Vocabulary


@dataclass(frozen=True)
class Spelling:
    """A vocabulary the instant backends spell text with: every token's bytes, and `encode`,
    which writes bytes with those tokens."""

    name: str
    table: TokenTable
    encode: Callable[[bytes], list[int]]

    @property
    def n_vocab(self) -> int:
        return len(self.table.pieces)


def qwen_spelling(path: str | Path) -> Spelling:
    """The vocabulary of a GGUF model file (the embedded Qwen2.5 target's: 151,936 tokens), read
    without its weights, as the llama.cpp backend hands it to llguidance."""
    vocab = Vocabulary(path)
    return Spelling(f"{Path(path).name}'s vocabulary", vocab.token_table(), vocab.tokenize)


def byte_spelling(n_vocab: int) -> Spelling:
    """Token i is byte i for i < 256, 256 is the end-of-generation control token, and the rest
    are distinct 2-3 byte pieces of printable ASCII (so a mask walks a vocabulary of
    `n_vocab` real tokens); text is written a byte a token."""
    printable = [bytes([c]) for c in range(32, 127)]
    pieces: list[bytes] = [bytes([b]) for b in range(256)] + [b"<|end|>"]
    for a in printable:
        for b in printable:
            pieces.append(a + b)
    for a in printable:
        for b in printable:
            for c in printable:
                if len(pieces) >= n_vocab:
                    break
                pieces.append(a + b + c)
    if len(pieces) < n_vocab:
        raise ValueError(f"the byte-level table spells at most {len(pieces):,} tokens")
    return Spelling(f"a byte-level table of {n_vocab:,} tokens",
                    TokenTable(tuple(pieces[:n_vocab]), frozenset({256}), 256), list)


class SpelledBackend(InstantBackend):
    """An instant backend whose tokens spell text as `spelling` does, so a grammar compiles
    for it and its forced stretches tokenize as its vocabulary would."""

    def __init__(self, bank: np.ndarray, name: str, spelling: Spelling) -> None:
        super().__init__(bank, name)
        self.spelling = spelling

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.spelling.encode(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return self.spelling.table.pieces[token]

    def is_eog(self, token: int) -> bool:
        return token == self.spelling.table.eos

    def token_table(self) -> TokenTable:
        return self.spelling.table
