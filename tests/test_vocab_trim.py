"""The trimmed-vocabulary draft: which tokens it keeps, the GGUF it derives, the backend that
feeds it embeddings and widens its logits, and that drafting with it stays exact."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from engine.backend import Part
import pytest

from app.cli import build_parser
from app.settings import load_options
from engine.backend import ModelConfig
from engine.drafters.draft_model import DraftModelDrafter
from engine.trimmed_backend import TrimmedBackend
from engine.errors import ModelFileError, SettingsError
from bench.exactness.check import ExactnessPlan, run_exactness
from engine.session import Session
from loading.derived.embeddings import EmbeddingTable
from models.gguf_file import GGUFFile
from models.gguf_info import read_info
from loading.derived.vocab_trim import (SOURCE_KEY, corpus_files, derive_trimmed, has_letter,
                                        kept_ids, round_up, select_tokens, write_trimmed)
from loading.options import LoadOptions
from loading.load import load_pair
from tests import tinygguf
from bench.fakes.backend import FakeBackend

N_EMBD = 32


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))


def pieces(table: dict[int, bytes], default: bytes = b"word"):
    return lambda t: table.get(t, default)


def test_letters():
    assert has_letter(b" def") and has_letter("é".encode()) and has_letter("秋".encode())
    assert not has_letter(b"    ") and not has_letter(b"```\n") and not has_letter(b" 42")
    assert not has_letter(b"_") and not has_letter(b"\xe7")


def test_selection_keeps_low_ranks_the_corpus_specials_and_letterless_tokens():
    ids = select_tokens(20, pieces({12: b"  ", 13: b"})\n", 14: b"x1"}), lambda t: t == 19,
                        corpus_ids=[15, 15, 99, -1], rank_keep=5)
    assert ids.tolist() == [0, 1, 2, 3, 4, 12, 13, 15, 19]
    assert ids.dtype == np.int32
    with pytest.raises(SettingsError):
        select_tokens(20, pieces({}), lambda t: False, [], rank_keep=0)


def test_the_corpus_is_the_standard_library_without_its_tests():
    files = corpus_files()
    names = {f.name for f in files}
    assert "functools.py" in names and "textwrap.py" in names
    assert not any("test" in f.parts or "tests" in f.parts for f in files)


def tokens(n: int) -> list[str]:
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"tok{i}" for i in range(n - 3)]


def source_file(tmp_path: Path, n: int = 40, output: bool = True,
                qtype=gguf.GGMLQuantizationType.F32) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    embd = rng.standard_normal((n, N_EMBD)).astype(np.float32)
    head = rng.standard_normal((n, N_EMBD)).astype(np.float32) if output else None
    path = tinygguf.write(tmp_path / "draft.gguf", tokens=tokens(n), n_embd=N_EMBD, bos=1, eos=2,
                          eot=2, token_embd=embd, output=head, embd_type=qtype)
    return path, embd, head


def tensor(reader: gguf.GGUFReader, name: str) -> np.ndarray:
    return [t for t in reader.tensors if t.name == name][0].data


def test_the_trimmed_file_keeps_the_chosen_rows_and_remaps_special_ids(tmp_path):
    src, embd, head = source_file(tmp_path)
    ids = np.array([0, 1, 2, 5, 7, 30], dtype=np.int32)
    out = tmp_path / "trimmed.gguf"
    write_trimmed(GGUFFile(read_info(src)), out, ids, "ab" * 32)
    r = gguf.GGUFReader(str(out))
    assert r.fields["tokenizer.ggml.tokens"].contents() == [tokens(40)[i] for i in ids]
    assert len(r.fields["tokenizer.ggml.token_type"].contents()) == len(ids)
    assert r.fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert r.fields[SOURCE_KEY].contents() == "ab" * 32
    assert kept_ids(out).tolist() == ids.tolist()
    np.testing.assert_array_equal(tensor(r, "token_embd.weight"), embd[ids])
    np.testing.assert_array_equal(tensor(r, "output.weight"), head[ids])
    s = gguf.GGUFReader(str(src))
    np.testing.assert_array_equal(tensor(r, "blk.0.attn_q.weight"), tensor(s, "blk.0.attn_q.weight"))
    with pytest.raises(ModelFileError, match="not a vocabulary-trimmed"):
        kept_ids(src)


def test_quantized_rows_are_sliced_as_stored(tmp_path):
    src, embd, _ = source_file(tmp_path, output=False, qtype=gguf.GGMLQuantizationType.Q8_0)
    ids = np.array([1, 2, 9], dtype=np.int32)
    out = tmp_path / "trimmed.gguf"
    write_trimmed(GGUFFile(read_info(src)), out, ids, "0" * 64)
    rows = EmbeddingTable(read_info(out)).rows([0, 1, 2])
    np.testing.assert_allclose(rows, embd[ids], atol=0.05)
    table = EmbeddingTable(read_info(src))
    assert (table.n_vocab, table.n_embd) == (40, N_EMBD)
    np.testing.assert_array_equal(table.rows([9]), rows[2:])


def test_derive_builds_once_keeps_specials_and_follows_the_source(tmp_path):
    # Control tokens last, so that neither the selection nor the rounding reaches them.
    names = [f"tok{i}" for i in range(37)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    src = tinygguf.write(tmp_path / "draft.gguf", tokens=names, n_embd=N_EMBD, bos=38, eos=39)
    calls = []

    def selection(path: Path, rank_keep: int) -> np.ndarray:
        calls.append(rank_keep)
        return np.arange(10, 10 + rank_keep, dtype=np.int32)

    out = derive_trimmed(src, rank_keep=4, selection=selection)
    # The selection (10..13), the control tokens whatever it said, and the lowest other ids up
    # to whole kernel tiles of 32 rows.
    assert kept_ids(out).tolist() == list(range(29)) + [37, 38, 39]
    assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.eos_token_id"].contents() == 31
    assert derive_trimmed(src, rank_keep=4, selection=selection) == out and calls == [4]
    tinygguf.write(src, tokens=names + ["tok40"], n_embd=N_EMBD, bos=38, eos=39)
    out2 = derive_trimmed(src, rank_keep=4, selection=selection)
    assert out2 != out and not out.exists() and calls == [4, 4]
    with pytest.raises(ModelFileError, match="not found"):
        derive_trimmed(tmp_path / "missing.gguf")


class EmbeddedFake(FakeBackend):
    """The fake model with its head cut to `ids`, reading inputs as embeddings: each is matched
    back to the token whose row it is, so its logits are the full fake's at the kept ids."""

    def __init__(self, table: np.ndarray, ids: np.ndarray, **kw) -> None:
        super().__init__(**kw)
        self.table, self.ids = table, ids
        self.n_vocab = len(ids)

    def decode_embeddings(self, embd, pos, rows, seq=0):
        toks = [int(np.argmin(((self.table - e) ** 2).sum(axis=1))) for e in embd]
        return FakeBackend.decode(self, toks, pos, rows, seq)[:, self.ids]

    def decode_embeddings_batch(self, embd, parts):
        self.batches.append(tuple((p.seq, len(p.tokens)) for p in parts))
        out, start = [], 0
        for p in parts:
            out.append(self.decode_embeddings(embd[start:start + len(p.tokens)], p.pos, p.rows,
                                              p.seq))
            start += len(p.tokens)
        return out

    def _row(self, context):
        full = FakeBackend(n_vocab=len(self.table), seed=self.seed, noise=self.noise,
                           scale=self.scale, order=self.order)
        return full._row(context)


class Table:
    def __init__(self, rows: np.ndarray) -> None:
        self.table, self.n_vocab, self.n_embd = rows, rows.shape[0], rows.shape[1]

    def rows(self, toks):
        return self.table[np.asarray(toks)]


class Vocab:
    def tokenize(self, data: bytes) -> list[int]:
        return [1 + b % 63 for b in data]

    def piece(self, token: int) -> bytes:
        return bytes([97 + token % 26])

    def is_eog(self, token: int) -> bool:
        return token == 2

    def close(self) -> None:
        pass


def trimmed_fake(ids, seed=1, noise=1.0, scale=3.5, n_vocab=64) -> TrimmedBackend:
    table = np.random.default_rng(7).standard_normal((n_vocab, 8)).astype(np.float32)
    inner = EmbeddedFake(table, np.asarray(ids), n_vocab=n_vocab, seed=seed, noise=noise,
                         scale=scale)
    return TrimmedBackend(inner, np.asarray(ids), Table(table), Vocab())


def test_the_trimmed_backend_gives_the_full_models_logits_at_kept_ids_and_minus_inf_elsewhere():
    ids = np.array([0, 3, 4, 9, 20, 41, 63])
    tb = trimmed_fake(ids)
    full = FakeBackend(n_vocab=64, seed=1, noise=1.0, scale=3.5)
    context = [5, 6, 7, 8]
    got = tb.decode(context, 0, [1, 3])
    want = full.decode(context, 0, [1, 3])
    assert got.shape == (2, 64)
    np.testing.assert_array_equal(got[:, ids], want[:, ids])
    assert np.isneginf(np.delete(got, ids, axis=1)).all()
    tb.truncate(2)
    assert tb.inner.cache == [5, 6]
    assert tb.tokenize("ab") == Vocab().tokenize(b"ab") and tb.is_eog(2) and tb.n_vocab == 64
    with pytest.raises(ModelFileError, match="kept ids"):
        TrimmedBackend(tb.inner, ids[:-1], tb.table, Vocab())


def test_the_trimmed_backend_decodes_several_sequences_in_one_call():
    ids = np.array([0, 3, 4, 9, 20, 41, 63])
    tb = trimmed_fake(ids)
    parts = [Part(1, [5, 6, 7], 0, [2]), Part(2, [9, 8], 0, [0, 1])]
    got = tb.decode_batch(parts)
    assert tb.inner.batches == [((1, 3), (2, 2))]
    alone = trimmed_fake(ids)
    for part, rows in zip(parts, got):
        np.testing.assert_array_equal(rows, alone.decode(part.tokens, 0, part.rows, part.seq))
    assert tb.inner.caches[1] == [5, 6, 7] and tb.inner.caches[2] == [9, 8]


def test_drafting_with_a_trimmed_head_stays_exact():
    """The target puts mass on tokens the draft cannot propose (about half the vocabulary is
    cut): q is 0 there, the residual max(0, p - q) restores them, and the samples still follow
    the target."""
    from tests.test_exactness_fake import PROMPT
    ids = np.arange(0, 64, 2)
    target = Session(FakeBackend(seed=1, scale=2.0))
    drafter = DraftModelDrafter(trimmed_fake(ids))
    plan = ExactnessPlan(samples=600, seed=3, gamma=3, tokens=3, control_tv=0.99,
                         settings=ExactnessPlan().settings[:2])
    rep = run_exactness(target, drafter, PROMPT, plan)
    assert all(r.passed for r in rep.results), [[c.p_value for c in r.comparisons]
                                                for r in rep.results]
    assert 0.0 < rep.results[0].acceptance_rate < 1.0
    assert not rep.control.passed


def test_an_unknown_draft_vocabulary_is_refused_before_loading(tmp_path):
    target = tinygguf.write(tmp_path / "target.gguf")
    loaded = []
    with pytest.raises(SettingsError, match="draft vocabulary"):
        load_pair(ModelConfig(str(target)), ModelConfig(str(target)),
                  LoadOptions(check_budget=False, check_compat=False, draft_vocab="half"),
                  loader=lambda cfg: loaded.append(cfg) or FakeBackend())
    assert loaded == []


def test_the_cli_option_reaches_the_load_options():
    base = ["generate", "--prompt", "x", "--target", "t.gguf", "--draft", "d.gguf"]
    assert load_options(build_parser().parse_args(base)).draft_vocab == "full"
    args = build_parser().parse_args(base + ["--draft-vocab", "trim"])
    assert load_options(args).draft_vocab == "trim"
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--draft-vocab", "half"])


def test_the_kept_rows_are_rounded_up_to_whole_kernel_tiles():
    ids = np.array([0, 5, 9], dtype=np.int32)
    assert round_up(ids, 100, multiple=8).tolist() == [0, 1, 2, 3, 4, 5, 6, 9]
    assert round_up(ids, 5, multiple=8).tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert round_up(np.arange(16, dtype=np.int32), 100, multiple=8).tolist() == list(range(16))


def test_a_trimmed_draft_in_the_store_is_planned_from_its_own_bytes(tmp_path):
    from loading.derived.vocab_trim import DEFAULT_RANK_KEEP
    from loading.plan import plan_load
    from models.budget import Layout
    from models.machine import Machine
    gib = 1 << 30
    card = Machine(64 * gib, 60 * gib, "Test GPU", 8 * gib, 8 * gib)
    vocab = tinygguf.vocab(400)
    rows = np.zeros((400, N_EMBD), dtype=np.float32)
    t = tinygguf.write(tmp_path / "t.gguf", tokens=vocab, n_embd=N_EMBD)
    d = tinygguf.write(tmp_path / "d.gguf", tokens=vocab, n_embd=N_EMBD, output=rows)
    options = LoadOptions(draft_quant="off", draft_vocab="trim")

    def draft_weights() -> int:
        plan = plan_load(ModelConfig(str(t), n_ctx=256), ModelConfig(str(d), n_ctx=256),
                         options, machine=card)
        assert plan.trim_vocab and plan.draft_info.path == d
        return plan.offload.placement("draft").weights

    # Not built yet: planned at the full vocabulary (an upper bound), as the source.
    full = draft_weights()
    assert full == Layout.from_info(read_info(d)).output_bytes + sum(
        Layout.from_info(read_info(d)).layer_bytes)
    built = derive_trimmed(d, rank_keep=DEFAULT_RANK_KEEP,
                           selection=lambda path, keep: np.arange(8, dtype=np.int32))
    own = Layout.from_info(read_info(built))
    # Built: the plan reads the trimmed file's own header, its output 32 rows of 400.
    assert draft_weights() == own.output_bytes + sum(own.layer_bytes) < full
