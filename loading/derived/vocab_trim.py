"""A draft with a trimmed output vocabulary: the GGUF Tandem derives, and which tokens it keeps.

On a CPU the draft's output head is a large share of its work: Qwen2.5's 151,936-token head is
28% of the 0.5B draft's weights read per token. A draft may propose only the tokens its head
keeps; any proposal stays exact (the acceptance rule holds for every q, and q is 0 elsewhere),
so trimming trades some acceptance, where the target's next token was cut, for a cheaper draft.

Kept, by rules that read only the draft's own tokenizer (never the benchmark's prompts):
- every control, user-defined or byte token (chat markers, end of turn);
- every token without a letter (whitespace, digits, punctuation: code's indentation, fences and
  operators);
- the first `rank_keep` ids: byte-level BPE vocabularies number tokens in merge order, so low ids
  are the pieces most frequent in the tokenizer's own training text;
- every token of Python's standard library sources as this tokenizer encodes them (code and
  English docstrings), a corpus every Python install carries.
The derived file keeps every key and tensor of the source except the vocabulary arrays and the
rows of `token_embd` and `output` (sliced in their stored quantization), and records the kept
ids (`tandem.vocab_trim.ids`). Inputs still need every token: the draft is fed embeddings read
from the source's table (loading/derived/embeddings.py, engine/trimmed_backend.py).
"""
from __future__ import annotations

import re
import sysconfig
from pathlib import Path
from typing import Any, Callable, Iterable

import gguf
import numpy as np
import numpy.typing as npt

from engine.llama import backend as llama
from engine.errors import ModelFileError, SettingsError
from loading.derived.files import derive
from loading.derived.gguf_copy import DROP, kept, write_copy
from models.gguf_file import GGUFFile
from models.gguf_info import GGUFInfo, read_info

I32 = npt.NDArray[np.int32]

DEFAULT_RANK_KEEP = 49152
# ggml's CPU kernels repack a quantized matrix into interleaved tiles only when its row count is
# a multiple of 8 (Q4_0 on AVX2/AVX-512); without it the trimmed head ran on the slower path and
# gave back half the saving (63,661 rows: 26.0 ms a token against 28.3 untrimmed).
ROW_MULTIPLE = 32
SOURCE_KEY = "tandem.vocab_trim.source_sha256"
IDS_KEY = "tandem.vocab_trim.ids"
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
_ROW_TENSORS = ("token_embd.weight", "output.weight")
_LETTER = re.compile(r"[^\W\d_]")


def has_letter(piece: bytes) -> bool:
    return bool(_LETTER.search(piece.decode("utf-8", errors="ignore")))


def corpus_files() -> list[Path]:
    """Python's standard library sources, without its test suites."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages"}
    return sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))


def select_tokens(n_vocab: int, pieces: Callable[[int], bytes], special: Callable[[int], bool],
                  corpus_ids: Iterable[int], rank_keep: int = DEFAULT_RANK_KEEP) -> I32:
    """Sorted ids the trimmed head keeps (the rules in the module docstring)."""
    if rank_keep < 1:
        raise SettingsError(f"rank_keep must be >= 1, got {rank_keep}")
    keep = np.zeros(n_vocab, dtype=bool)
    keep[:min(rank_keep, n_vocab)] = True
    ids = np.fromiter(corpus_ids, dtype=np.int64)
    keep[ids[(ids >= 0) & (ids < n_vocab)]] = True
    for t in np.flatnonzero(~keep):
        if special(int(t)) or not has_letter(pieces(int(t))):
            keep[t] = True
    return np.flatnonzero(keep).astype(np.int32)


def round_up(ids: I32, n_vocab: int, multiple: int = ROW_MULTIPLE) -> I32:
    """`ids` plus the lowest ids not in it, up to a multiple of `multiple` rows (or all)."""
    missing = np.setdiff1d(np.arange(n_vocab), ids)
    extra = (-len(ids)) % multiple
    return np.union1d(ids, missing[:extra]).astype(np.int32)


def write_trimmed(source: GGUFFile, out: Path, ids: I32, sha: str) -> None:
    """Write `source`'s model with only the vocabulary entries and head rows in `ids`."""
    index = {int(t): i for i, t in enumerate(ids)}
    changed: dict[str, Any] = {}
    for key in _VOCAB_ARRAYS:
        if key in source.info.fields:
            values = source.value(key)
            changed[key] = [values[int(t)] for t in ids]
    for key, value in source.info.metadata.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            changed[key] = index.get(int(value), DROP)
    tensors = [(t, (t.shape[0], len(ids)), source.rows(t)[ids]) if t.name in _ROW_TENSORS
               else kept(t, source) for t in source.info.tensors]
    write_copy(source, out, changed,
               [(SOURCE_KEY, sha, gguf.GGUFValueType.STRING, None),
                (IDS_KEY, [int(t) for t in ids], gguf.GGUFValueType.ARRAY,
                 gguf.GGUFValueType.UINT32)], tensors)


def kept_ids(path: str | Path) -> I32:
    """The source ids a trimmed GGUF keeps, in its own id order."""
    ids = GGUFFile(read_info(path)).value(IDS_KEY)
    if ids is None:
        raise ModelFileError(f"{Path(path).name} is not a vocabulary-trimmed draft")
    return np.asarray(ids, dtype=np.int32)


def tag(rank_keep: int) -> str:
    return f"vocab-{rank_keep}"


def _llama_selection(source: Path, rank_keep: int) -> I32:
    vocab = llama.Vocabulary(source)
    try:
        corpus = (t for f in corpus_files() for t in vocab.tokenize(f.read_bytes()))
        return select_tokens(vocab.n_vocab, vocab.piece, vocab.is_control, corpus, rank_keep)
    finally:
        vocab.close()


def derive_trimmed(source: str | Path, rank_keep: int = DEFAULT_RANK_KEEP,
                   selection: Callable[[Path, int], I32] | None = None,
                   info: GGUFInfo | None = None) -> Path:
    """Path of `source` with a trimmed vocabulary, building it unless a current one exists;
    `info` is the source's header when the caller has read it (else it is read when building)."""

    def prepare(source: Path, sha: str) -> Callable[[Path], None]:
        header = (info if info is not None and info.path.resolve() == source.resolve()
                  else read_info(source))
        if not any(t.name == "token_embd.weight" for t in header.tensors):
            raise ModelFileError(f"{source.name} has no token_embd.weight to trim")
        ids = (selection or _llama_selection)(source, rank_keep)
        if header.token_types:
            # Whatever the selection said, the tokenizer's own special tokens stay.
            kinds = [int(k) for k in (gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL,
                                      gguf.TokenType.USER_DEFINED, gguf.TokenType.BYTE)]
            types = np.asarray(header.token_types, dtype=np.int64)
            ids = np.union1d(ids, np.flatnonzero(np.isin(types, kinds))).astype(np.int32)
        ids = round_up(ids, len(header.token_types) if header.token_types
                       else int(ids.max()) + 1)
        source_file = GGUFFile(header)
        return lambda tmp: write_trimmed(source_file, tmp, ids, sha)

    return derive(source, tag(rank_keep), prepare)
