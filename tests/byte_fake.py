"""A byte-level fake backend for grammar tests: token i is byte i (0..255) and token 256 the
end-of-generation control token, so `tokenize` spells any text with the vocabulary's own tokens,
as llguidance needs to force canonical tokenizations (tests/fakes.py's FakeBackend does not)."""
from __future__ import annotations

from tests.fakes import FakeBackend

EOG = 256


class ByteFake(FakeBackend):
    def __init__(self, seed: int = 0, noise: float = 0.0, n_ctx: int = 4096) -> None:
        super().__init__(n_vocab=EOG + 1, seed=seed, noise=noise, n_ctx=n_ctx, eog=EOG)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == EOG else bytes([token])
