"""The embedded draft with a trimmed vocabulary, through llama.cpp: same logits at every kept
token as the untrimmed draft, and a pair that loads and drafts with it."""
from __future__ import annotations

import numpy as np
import pytest

from engine.backend import ModelConfig
from engine.trimmed_backend import TrimmedBackend
from engine.events import DoneEvent
from engine.generator import GenerationConfig
from engine.llama.backend import load
from engine.control.policy import FixedGamma
from engine.sampling import SamplingParams
from loading.derived.embeddings import load_trimmed
from loading.derived.quantized import derive_quantized
from loading.derived.vocab_trim import derive_trimmed, kept_ids
from loading.options import LoadOptions
from loading.load import load_pair
from models.gguf_info import read_info

pytestmark = pytest.mark.real

TEXT = ("<|im_start|>user\nWrite a palindrome check in Python, then say it in French.<|im_end|>\n"
        "<|im_start|>assistant\n```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```\n"
        "Vérifier un palindrome")


@pytest.mark.long
def test_trimmed_logits_equal_the_full_drafts_at_every_kept_token(embedded_paths):
    source = derive_quantized(embedded_paths[1], "q4_0")
    path = derive_trimmed(source)
    ids = kept_ids(path)
    # Code, whitespace and the chat markers stay; most of the 151,936 tokens go.
    assert 0.3 < len(ids) / 151936 < 0.5
    full = load(ModelConfig(str(source), n_ctx=256, n_threads=2))
    try:
        context = full.tokenize(TEXT, True, True)
        rows = list(range(len(context)))
        want = full.decode(context, 0, rows)
    finally:
        full.close()
    trimmed = load_trimmed(read_info(source), path, load(ModelConfig(str(path), n_ctx=256, n_threads=2)))
    try:
        # Inputs the head no longer has (the accented French) are still read, as embeddings.
        assert not np.isin(context, ids).all()
        got = trimmed.decode(context, 0, rows)
        assert np.abs(got[:, ids] - want[:, ids]).max() < 1e-3
        assert np.isneginf(np.delete(got, ids, axis=1)).all()
        kept_rows = np.isin(want.argmax(axis=1), ids)
        assert (got.argmax(axis=1)[kept_rows] == want.argmax(axis=1)[kept_rows]).all()
        # Incremental decodes after the batch see the same cache.
        one = trimmed.decode([context[-1]], len(context), [0])
        assert np.isfinite(one[0, ids]).all()
    finally:
        trimmed.close()


@pytest.mark.long
def test_a_pair_loads_and_drafts_with_the_trimmed_draft(embedded_paths):
    target, draft = embedded_paths
    pair = load_pair(ModelConfig(str(target), n_ctx=512, n_threads=2),
                     ModelConfig(str(draft), n_ctx=512, n_threads=2),
                     LoadOptions(check_budget=False, draft_vocab="trim"))
    try:
        assert isinstance(pair.draft_backend, TrimmedBackend)
        assert ".vocab-" in pair.draft_path
        config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=3, max_tokens=24)
        # A fixed gamma, so that the run drafts whatever the calibration on a busy machine says.
        done = [ev for ev in pair.generate("Write a Python function that adds two numbers.",
                                           config, policy=FixedGamma(3))][-1]
        assert isinstance(done, DoneEvent) and len(done.tokens) == 24
        assert done.stats.accepted_tokens > 0 and "def" in done.text
    finally:
        pair.close()
