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


def test_different_eos_that_neither_adds_only_warns(tmp_path, target):
    # llama.cpp compares EOS ids only where add_eos is set; a gpt2 tokenizer without the key
    # does not add EOS.
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(400), eos=1)
    r = check_pair(target, draft)
    assert r.verdict == "warning" and r.reasons == []
    assert any("EOS ids differ (target 2, draft 1); neither adds EOS" in w for w in r.warnings)


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


def pair(tmp_path, target_kw: dict, draft_kw: dict):
    """check_pair on two tiny GGUFs with the same vocabulary and the given header differences."""
    t = tinygguf.write(tmp_path / "t.gguf", tokens=tinygguf.vocab(400), **target_kw)
    d = tinygguf.write(tmp_path / "d.gguf", tokens=tinygguf.vocab(400), **draft_kw)
    return check_pair(t, d)


def test_different_bos_that_neither_adds_only_warns(tmp_path):
    r = pair(tmp_path, dict(bos=0, add_bos=False), dict(bos=1, add_bos=False))
    assert r.verdict == "warning" and any("BOS ids differ (target 0, draft 1)" in w for w in r.warnings)


def test_different_bos_that_both_add_is_incompatible(tmp_path):
    r = pair(tmp_path, dict(bos=0, add_bos=True), dict(bos=1, add_bos=True))
    assert r.verdict == "incompatible" and "BOS differs (target 0, draft 1) and both add it" in r.summary


def test_different_eos_that_both_add_is_incompatible(tmp_path):
    r = pair(tmp_path, dict(eos=2, add_eos=True), dict(eos=1, add_eos=True))
    assert r.verdict == "incompatible" and "EOS differs (target 2, draft 1) and both add it" in r.summary


def test_add_eos_flag_difference_is_incompatible(tmp_path):
    r = pair(tmp_path, dict(add_eos=True), dict(add_eos=False))
    assert r.verdict == "incompatible" and "add-EOS flag differs (target True, draft False)" in r.summary


def test_an_absent_add_eos_is_the_tokenizer_default(tmp_path):
    # gpt2 (BPE) does not add EOS by default: absent equals an explicit false...
    assert pair(tmp_path, dict(add_eos=None), dict(add_eos=False)).verdict == "compatible"
    # ...t5 (UGM) does, so there an absent key equals an explicit true.
    t5 = dict(tokenizer_model="t5", eos=2)
    assert pair(tmp_path, dict(t5, add_eos=None), dict(t5, add_eos=True)).verdict == "compatible"
    r = pair(tmp_path, dict(t5, add_eos=None), dict(t5, add_eos=False))
    assert r.verdict == "incompatible" and "add-EOS flag differs (target True, draft False)" in r.summary


def test_an_absent_add_bos_is_the_tokenizer_default(tmp_path):
    # SPM ("llama") adds BOS by default.
    spm = dict(tokenizer_model="llama")
    assert pair(tmp_path, dict(spm, add_bos=None), dict(spm, add_bos=True)).verdict == "compatible"
    r = pair(tmp_path, dict(spm, add_bos=None), dict(spm, add_bos=False))
    assert r.verdict == "incompatible" and "add-BOS flag differs (target True, draft False)" in r.summary
    # BPE adds BOS by default only for some pre-tokenizers (llama-bpe yes, qwen2 no).
    r = pair(tmp_path, dict(pre="llama-bpe", add_bos=None), dict(pre="llama-bpe", add_bos=False))
    assert r.verdict == "incompatible" and "add-BOS flag differs (target True, draft False)" in r.summary
    assert pair(tmp_path, dict(add_bos=None), dict(add_bos=False)).verdict == "compatible"


def test_an_absent_special_id_is_the_tokenizer_default(tmp_path):
    # SPM's default BOS is 1: a header without the key and one that says 1 agree where both add it.
    spm = dict(tokenizer_model="llama", add_bos=True)
    assert pair(tmp_path, dict(spm, bos=None), dict(spm, bos=1)).verdict == "compatible"
    r = pair(tmp_path, dict(spm, bos=None), dict(spm, bos=0))
    assert r.verdict == "incompatible" and "BOS differs (target 1, draft 0)" in r.summary


def test_an_id_outside_the_vocabulary_falls_back_to_the_default(tmp_path):
    # llama.cpp ignores such an id with a warning and keeps the tokenizer's default (SPM: 1).
    spm = dict(tokenizer_model="llama", add_bos=True)
    assert pair(tmp_path, dict(spm, bos=10_000), dict(spm, bos=1)).verdict == "compatible"
