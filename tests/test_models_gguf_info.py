"""Header reading: fields from tiny written GGUFs and real files, and the three bad-file errors."""
from __future__ import annotations


import pytest

from tests import file_reads, realmodels
from tests import tinygguf
from engine.errors import ModelFileError
from models.gguf_info import read_info


def test_reads_written_header(tmp_path):
    p = tinygguf.write(tmp_path / "m.gguf", n_layer=3, n_embd=32, n_head=4, n_head_kv=2, eot=2, n_ctx_train=1234)
    info = read_info(p)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == ("llama", 3, 32, 4, 2)
    assert (info.head_dim_k, info.n_ctx_train, info.n_vocab) == (8, 1234, 300)
    assert (info.tokenizer_model, info.tokenizer_pre, info.bos_id, info.eos_id, info.eot_id) == ("gpt2", "qwen2", 0, 2, 2)
    assert info.add_bos is False and info.chat_template == tinygguf.TEMPLATE
    assert info.file_type == "ALL_F32"
    assert info.tensor_bytes == (300 * 32 + 3 * 32 * 32) * 4
    assert info.control_tokens == frozenset({0, 1, 2})


def test_token_hash_tracks_token_texts(tmp_path):
    a = read_info(tinygguf.write(tmp_path / "a.gguf"))
    b = read_info(tinygguf.write(tmp_path / "b.gguf", n_layer=5))
    toks = tinygguf.vocab()
    toks[7] = "changed"
    c = read_info(tinygguf.write(tmp_path / "c.gguf", tokens=toks))
    assert a.tokens_sha256 == b.tokens_sha256 != c.tokens_sha256


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="model file not found: .*nope.gguf"):
        read_info(tmp_path / "nope.gguf")


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"<html>not a model</html>" * 10)
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_info(p)


@pytest.mark.parametrize("keep", [0.3, 0.97])
def test_truncated(tmp_path, keep):
    p = tinygguf.write(tmp_path / "t.gguf")
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError, match="is truncated"):
        read_info(p)


@pytest.mark.real
def test_real_target_header_reads_the_header_not_the_weights():
    target, _ = realmodels.embedded_pair()
    with file_reads.counted(target.parent) as reads:
        info = read_info(target)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head_kv, info.n_vocab) == ("qwen2", 28, 1536, 2, 151936)
    assert info.file_type == "Q4_K_M"
    assert info.tensor_bytes <= info.file_size < info.tensor_bytes + 16 * 2**20
    # What keeps it quick, counted rather than timed: one open, and no more than the first
    # window (16 MB: the vocabulary) read of a 1.1 GB file.
    target = target.resolve()
    assert reads.opens == {target: 1}
    assert reads.bytes[target] <= 16 << 20 < info.file_size
