"""Pair compatibility: llama.cpp's rules on tiny written GGUFs, and the real-file expectations."""
from __future__ import annotations

import pytest

from tests import realmodels
from tests import tinygguf
from engine.errors import IncompatiblePairError, ModelFileError
from models.compat import check_pair, require_compatible


@pytest.fixture
def target(tmp_path):
    return tinygguf.write(tmp_path / "target.gguf", tokens=tinygguf.vocab(400), n_layer=4)


def test_identical_tokenizers_are_compatible(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), n_layer=1)
    r = check_pair(target, draft)
    assert r.verdict == "compatible" and r.reasons == [] and r.warnings == []
    assert "compatible" in r.summary and require_compatible(target, draft).ok


def test_vocab_difference_of_100_is_tolerated(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(300))
    r = check_pair(target, draft)
    assert r.verdict == "warning"
    assert any("differ by 100 tokens" in w for w in r.warnings)


def test_vocab_difference_of_200_is_not(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(200))
    r = check_pair(target, draft)
    assert r.verdict == "incompatible"
    assert "differ by 200 tokens" in r.summary and "at most 128" in r.summary
    with pytest.raises(IncompatiblePairError, match="differ by 200 tokens"):
        require_compatible(target, draft)


def test_one_changed_token_names_its_id(tmp_path, target):
    toks = tinygguf.vocab(400)
    toks[123] = "renamed"
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=toks)
    r = check_pair(target, draft)
    assert r.verdict == "incompatible"
    assert "token texts differ from id 123" in r.summary and "'renamed'" in r.summary


def test_change_below_checked_ids_is_only_a_warning(tmp_path, target):
    toks = tinygguf.vocab(400)
    toks[4] = "renamed"
    r = check_pair(target, tinygguf.write(tmp_path / "draft.gguf", tokens=toks))
    assert r.verdict == "warning" and any("id 4" in w for w in r.warnings)


def test_different_eos_is_incompatible(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), eos=1)
    r = check_pair(target, draft)
    assert r.verdict == "incompatible" and "EOS differs (target 2, draft 1)" in r.summary


def test_different_eot_and_template_warn(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), eot=1, template="{{ x }}")
    r = check_pair(target, draft)
    assert r.verdict == "warning"
    assert any("EOT" in w for w in r.warnings) and any("chat templates differ" in w for w in r.warnings)


def test_different_tokenizer_type(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), tokenizer_model="llama")
    assert "tokenizer types differ" in check_pair(target, draft).summary


def test_missing_draft_is_a_model_file_error(tmp_path, target):
    with pytest.raises(ModelFileError, match="model file not found"):
        check_pair(target, tmp_path / "missing.gguf")


@pytest.mark.real
def test_real_qwen_pair_compatible():
    target, draft = realmodels.embedded_pair()
    r = check_pair(target, draft)
    assert r.verdict in ("compatible", "warning"), r.summary
    assert r.reasons == []


@pytest.mark.real
def test_real_qwen_vs_gemma_incompatible():
    target, _ = realmodels.embedded_pair()
    r = check_pair(target, realmodels.gemma3_270m())
    assert r.verdict == "incompatible" and "tokenizer types differ" in r.summary


@pytest.mark.real
def test_real_qwen_vs_smollm2_incompatible():
    target, _ = realmodels.embedded_pair()
    r = check_pair(target, realmodels.smollm2_135m())
    assert r.verdict == "incompatible" and "vocabulary sizes differ" in r.summary


def test_add_bos_flag_difference_is_incompatible(tmp_path, target):
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), add_bos=True)
    r = check_pair(target, draft)
    assert r.verdict == "incompatible" and "add-BOS flag differs (target False, draft True)" in r.summary
