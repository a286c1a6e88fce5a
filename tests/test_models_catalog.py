"""The curated pair catalog: required families, the embedded pair first, lookups."""
from __future__ import annotations

import pytest

from engine.errors import SettingsError
from models import embedded
from models.catalog import default_pair, find_model, find_pair, load_catalog, recorded_size


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


def test_the_entries_the_hub_listing_contradicted_are_fixed():
    qwen25 = [p for p in load_catalog() if p.family == "Qwen2.5-Instruct"]
    assert len(qwen25) == 6
    for p in qwen25:
        assert (p.draft.repo, p.draft_file.filename) == ("Qwen/Qwen2.5-0.5B-Instruct-GGUF",
                                                          "qwen2.5-0.5b-instruct-q8_0.gguf")
    gemma27 = find_pair("gemma-3-27b+1b")
    assert (gemma27.target.repo, gemma27.target_file.filename) == ("ggml-org/gemma-3-27b-it-GGUF",
                                                                    "gemma-3-27b-it-Q4_K_M.gguf")
    # HuggingFaceTB's repositories hold only q8_0 (360M) and only q4_k_m (1.7B).
    assert list(find_model("smollm2-360m").files) == ["Q8_0"]
    assert list(find_model("smollm2-1.7b").files) == ["Q4_K_M"]


def test_recorded_sizes_are_exact_and_agree_with_the_estimates():
    refs = {(m.repo, f.filename): f for p in load_catalog() for m in (p.target, p.draft)
            for f in m.files.values()}
    recorded = {k: f.size for k, f in refs.items() if f.size is not None}
    assert recorded[("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf")] == 675_710_816
    for (repo, name), size in recorded.items():
        assert refs[(repo, name)].approx_size == size
        assert recorded_size(repo, name) == size
    unrecorded = next(k for k, f in refs.items() if f.size is None)
    assert recorded_size(*unrecorded) is None and recorded_size("nobody/x", "y.gguf") is None
