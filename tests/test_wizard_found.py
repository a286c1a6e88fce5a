"""The Models tab over fake stores of other tools (tests/fakestores.py): the list of models on
this machine with broken files and their reasons, the drafts on disk for a found target best
first, and a found model checked and loaded by name, Ollama spelling included."""
from __future__ import annotations

import shutil
from unittest import mock

import pytest

from app.ui import wizard
from app.runtime.holder import READY, PairHolder
from engine.llama import quantize as llama_quantize
from engine.backend import ModelConfig
from tests import fakestores
from bench.fakes.backend import FakeBackend
from tests.fakestores import BIG, SMALL


@pytest.fixture
def machine(tmp_path, monkeypatch):
    return fakestores.machine(tmp_path, monkeypatch)


def test_the_models_tab_lists_pairs_and_loads_found_models_by_name(machine):
    listed = wizard.FoundList()
    assert {value for _, value in listed.choices()} >= {BIG, SMALL}
    assert "gone:1b" not in {value for _, value in listed.choices()}
    gone = next(r for r in listed.rows() if r[0] == "gone:1b")
    assert gone[1] == "Ollama" and gone[-1].startswith("unusable: its blob")
    drafts = listed.drafts(BIG)
    assert drafts[0] == (f"{SMALL}: compatible; memory: fits", f"|{SMALL}")
    assert "3 compatible drafts on disk" in listed.note(BIG, len(drafts))

    _, verdict = wizard.check("", BIG, "", "tiny", 256)
    assert verdict["ok"] and verdict["missing"] == []
    _, refused = wizard.check("", "qwen9:70b", "", "tiny", 256)
    assert not refused["ok"] and "neither a file nor a model found" in refused["reason"]

    loaded: list[ModelConfig] = []

    def loader(config: ModelConfig) -> FakeBackend:
        loaded.append(config)
        return FakeBackend()

    holder = PairHolder(loader=loader)
    copy = lambda src, dst, kind: shutil.copyfile(src, dst)  # noqa: E731 - requantizing stand-in
    with mock.patch.object(llama_quantize, "quantize", copy):
        notes = list(wizard.load_pair(holder, "", BIG, "", "tiny", 256))
    assert "Loaded" in notes[-1], notes
    assert holder.status.state == READY and (holder.status.target, holder.status.draft) == (BIG, SMALL)
    assert [c.name for c in loaded] == [BIG, SMALL]
