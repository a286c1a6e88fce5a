"""A load is a plan, then its execution: the plan reads each header once, makes every check
and decides what to derive, and a test reads it without loading anything."""
from __future__ import annotations

import pytest

from engine.backend import ModelConfig
from engine.errors import IncompatiblePairError, SettingsError
from loading.options import LoadOptions
from loading.plan import plan_load
from models import gguf_info
from tests import tinygguf

TINY = dict(n_layer=4, n_embd=16)


def test_the_plan_reads_each_header_once_and_decides_the_derivations(tmp_path, monkeypatch):
    target = tinygguf.write(tmp_path / "t.gguf", **TINY)
    draft = tinygguf.write(tmp_path / "d.gguf", **TINY)
    reads: list[str] = []
    read = gguf_info.read_info

    def counted(path):
        reads.append(str(path))
        return read(path)
    monkeypatch.setattr("loading.plan.read_info", counted)
    plan = plan_load(ModelConfig(str(target), n_ctx=256), ModelConfig(str(draft), n_ctx=256),
                     LoadOptions(check_budget=False, draft_vocab="trim", early_exit=True))
    assert sorted(reads) == sorted([str(target), str(draft)])
    assert plan.target_info.path == target and plan.draft_info.path == draft
    # A float32 draft on the CPU is requantized; the early exit keeps three quarters.
    assert plan.draft_quant == "q4_0" and plan.trim_vocab and plan.early_exit_layers == 3
    alone = plan_load(ModelConfig(str(target), n_ctx=256), None, LoadOptions(check_budget=False))
    assert alone.draft is None and alone.draft_quant is None and not alone.trim_vocab
    assert alone.early_exit_layers is None


def test_the_plan_refuses_before_anything_is_derived_or_loaded(tmp_path):
    target = tinygguf.write(tmp_path / "t.gguf", **TINY)
    other = tinygguf.write(tmp_path / "o.gguf", **TINY, tokens=tinygguf.vocab()[::-1])
    with pytest.raises(IncompatiblePairError):
        plan_load(ModelConfig(str(target), n_ctx=256), ModelConfig(str(other), n_ctx=256),
                  LoadOptions(check_budget=False))
    with pytest.raises(SettingsError, match="draft vocabulary"):
        plan_load(ModelConfig(str(target), n_ctx=256), None, LoadOptions(draft_vocab="half"))
