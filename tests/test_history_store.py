"""The history on disk (loading/history.py) and where it is used: atomic, user-only files per
tokenizer and owner, an unreadable file set aside, `tandem history` and `clear`, the API's
history per key (`speculative.history`), and the app's setting."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from app.cli import main
from app.runtime.holder import PairHolder
from app.ui import controls
from app.ui.chat import respond
from app.ui.state import StopFlags
from engine.errors import SettingsError
from loading.history import (LOCAL, History, HistoryStore, clear_histories, history_files,
                             owner_for_key)
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from fastapi.testclient import TestClient
from tests.serve_fakes import fake_pair, serve_access


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_saved_history_is_user_only_and_read_back(tmp_path):
    store = HistoryStore("tok1", capacity=1000, root=tmp_path / "h")
    store.index().add([1, 2, 3, 4])
    store.save()
    path = store.path()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700 and mode(tmp_path / "h") == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["local.npz"]  # no temporary left
    again = HistoryStore("tok1", capacity=1000, root=tmp_path / "h")
    assert again.index().match([0, 1, 2], 2).tokens == [3, 4]
    # Another vocabulary never reads it; another owner has its own.
    assert HistoryStore("tok2", 1000, root=tmp_path / "h").index().n_documents == 0
    assert again.index(owner_for_key("k")).n_documents == 0
    key = "sk-secret-123"
    assert key not in owner_for_key(key) and owner_for_key(key) != owner_for_key("j")


def test_a_crash_mid_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    store = HistoryStore("tok", capacity=1000, root=tmp_path)
    store.index().add([1, 2, 3])
    store.save()
    store.index().add([7, 8, 9])

    def crash(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(SettingsError, match="cannot save the history"):
        store.save()
    monkeypatch.undo()
    assert [p.name for p in store.path().parent.iterdir()] == ["local.npz"]
    assert HistoryStore("tok", 1000, root=tmp_path).index().n_documents == 1


def test_an_unreadable_history_is_set_aside_and_starts_empty(tmp_path, capsys):
    store = HistoryStore("tok", capacity=1000, root=tmp_path)
    store.path().parent.mkdir(parents=True)
    store.path().write_bytes(b"not a zip")
    assert store.index().n_documents == 0
    err = capsys.readouterr().err
    assert "could not be read" in err and len(err.strip().splitlines()) == 1
    aside = list(store.path().parent.glob("local.npz.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"not a zip"
    assert aside[0].name in err and not store.path().exists()


def test_history_show_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_HISTORY", str(tmp_path))
    assert main(["history"]) == 0 and "no history" in capsys.readouterr().out
    for owner in (LOCAL, owner_for_key("k")):
        store = HistoryStore("tok", capacity=1000)
        store.index(owner).add([1, 2, 3])
        store.save(owner)
    assert len(history_files()) == 2
    assert main(["history"]) == 0 and "tok/local.npz" in capsys.readouterr().out
    assert main(["history", "clear"]) == 0 and "deleted 2 histories" in capsys.readouterr().out
    assert history_files() == [] and clear_histories() == []


def test_the_api_keeps_a_history_per_key(tmp_path):
    holder = PairHolder(fake_pair(), queue=GenerationQueue(2))
    store = holder.history = HistoryStore("tok", capacity=10_000, root=tmp_path)
    client = TestClient(create_app(holder, holder.queue, serve_access(None)))
    body = {"messages": [{"role": "user", "content": "def add(a, b): return a + b"}],
            "max_tokens": 24, "speculative": {"drafter": "suffix", "policy": "fixed", "gamma": 4}}

    def ask(key, **extra):
        r = client.post("/v1/chat/completions", json=body | extra,
                        headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return r.json()["speculative"]["by_source"]

    assert "suffix" not in ask("alice")
    # Alice's regeneration copies her first answer from her history; Bob has none of it.
    assert ask("alice")["suffix"]["accepted"] > 0
    assert "suffix" not in ask("bob")
    assert store.index(owner_for_key("alice")).n_documents == 2
    assert mode(store.path(owner_for_key("alice"))) == 0o600
    # A request may keep out of its history; a wrong value is a 400.
    ask("bob", speculative={**body["speculative"], "history": False})
    assert store.index(owner_for_key("bob")).n_documents == 1
    r = client.post("/v1/chat/completions", json=body | {"speculative": {"history": "no"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.history"


def test_the_apps_setting_turns_the_history_off(tmp_path):
    holder = PairHolder(fake_pair())
    holder.history = HistoryStore("tok", capacity=10_000, root=tmp_path)
    values = ("suffix", "fixed", 4, 0.0, 0, 1.0, 0.0, -1, 16)
    flags = StopFlags()
    off = controls.spec(holder.offer(), *values, history=False)
    list(respond(holder, flags, "s", "def add(a, b): return a + b", [], off))
    assert holder.history.index().n_documents == 0 and not holder.history.path().exists()
    on = controls.spec(holder.offer(), *values, history=True)
    *_, (_, _, _, stats, _, _) = respond(holder, flags, "s", "def add(a, b): return a + b", [], on)
    assert holder.history.index().n_documents == 1 and holder.history.path().exists()
    *_, (_, _, _, stats, _, _) = respond(holder, flags, "s", "def add(a, b): return a + b", [],
                                      controls.spec(holder.offer(), *values))
    assert stats["accepted_by"].get("suffix", 0) > 0
    assert History(holder.history).index is holder.history.index()
