"""The curated pair catalog: required families, the embedded pair first, lookups."""
from __future__ import annotations

import pytest

from engine.errors import SettingsError
from models import embedded
from models.catalog import default_pair, find_model, find_pair, load_catalog


def test_embedded_pair_is_first_and_offline():
    first = load_catalog()[0]
    assert first is default_pair() and first.offline
    assert first.local_paths() == (embedded.TARGET.path, embedded.DRAFT.path)
    assert first.target_file.approx_size == pytest.approx(embedded.TARGET.size, rel=0.01)
    assert first.draft_file.approx_size == pytest.approx(embedded.DRAFT.size, rel=0.01)
    assert not any(p.offline for p in load_catalog()[1:])


@pytest.mark.parametrize("target,draft", [
    *[(f"qwen2.5-coder-{n}", "qwen2.5-coder-0.5b") for n in ("1.5b", "3b", "7b", "14b", "32b")],
    *[(f"qwen2.5-{n}", "qwen2.5-0.5b") for n in ("1.5b", "3b", "7b", "14b", "32b", "72b")],
    *[(f"qwen3-{n}", "qwen3-0.6b") for n in ("4b", "8b", "14b", "32b")],
    ("llama-3.1-8b", "llama-3.2-1b"), ("llama-3.3-70b", "llama-3.2-1b"),
    ("gemma-3-4b", "gemma-3-270m"), ("gemma-3-12b", "gemma-3-1b"), ("gemma-3-27b", "gemma-3-1b"),
    ("smollm2-1.7b", "smollm2-135m"), ("smollm2-1.7b", "smollm2-360m"),
])
def test_required_pairs_present(target, draft):
    found = [p for p in load_catalog() if p.target.id == target and p.draft.id == draft]
    assert len(found) == 1
    p = found[0]
    assert "/" in p.target.repo and p.target_file.filename.endswith(".gguf") and p.target_file.approx_size > 0
    assert p.draft_file.approx_size < p.target_file.approx_size


def test_lookups():
    assert find_pair("qwen3-8b+0.6b").target.repo == "Qwen/Qwen3-8B-GGUF"
    assert find_model("bartowski/Qwen2.5-Coder-7B-Instruct-GGUF").id == "qwen2.5-coder-7b"
    assert find_model("nobody/nothing") is None
    with pytest.raises(SettingsError, match="unknown pair 'nope'"):
        find_pair("nope")
    with pytest.raises(SettingsError, match="no Q2_K file"):
        find_pair("qwen3-8b+0.6b").target.file("Q2_K")
