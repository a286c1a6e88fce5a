"""The chats store (loading/chats.py) and its exports (loading/chat_export.py): user-only files
written atomically, newest first, titles, rename, delete, the chat open last, an unreadable file
set aside, ids that cannot name a path outside the store."""
from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from dataclasses import replace

import pytest

from engine.errors import SettingsError
from loading.chat_export import file_stem, to_json, to_markdown
from loading.chats import TITLE_CHARS, UNTITLED, Chat, ChatChanged, ChatStore, title_of
from models import atomic


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def store(tmp_path) -> ChatStore:
    return ChatStore(tmp_path / "chats", now=Clock())


def talk(chat: Chat, *texts: str) -> Chat:
    msgs = list(chat.messages)
    for i, t in enumerate(texts):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return replace(chat, messages=tuple(msgs))


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_saved_chat_is_user_only_and_read_back_with_its_prompt_and_settings(tmp_path):
    s = store(tmp_path)
    chat = s.save(talk(s.new("Be brief.", {"temperature": 0.7}), "Hi there", "Hello!"))
    path = s.path(chat.id)
    assert mode(path) == 0o600 and mode(s.root) == 0o700
    assert sorted(p.name for p in s.root.iterdir()) == [path.name]  # no temporary left
    again = ChatStore(s.root).get(chat.id)
    assert again == chat
    assert again.system == "Be brief." and again.settings == {"temperature": 0.7}
    assert again.title == "Hi there" and [m["role"] for m in again.messages] == ["user", "assistant"]


def test_saves_go_through_the_one_atomic_write(tmp_path, monkeypatch):
    s = store(tmp_path)
    seen = []
    monkeypatch.setattr(atomic, "on_step", lambda step, tmp, out: seen.append((step, out.name)))
    chat = s.save(talk(s.new(), "a"))
    assert [step for step, _ in seen] == list(atomic.STEPS)
    assert {out for _, out in seen} == {f"{chat.id}.json"}


def test_chats_are_listed_newest_first_and_a_change_moves_one_to_the_top(tmp_path):
    s = store(tmp_path)
    a = s.save(talk(s.new(), "first"))
    b = s.save(talk(s.new(), "second"))
    assert [c.id for c in s.list()] == [b.id, a.id]
    s.save(talk(a, "reply", "more"))
    assert [c.id for c in s.list()] == [a.id, b.id]


def test_rename_keeps_the_name_and_the_order_and_delete_removes_the_file(tmp_path):
    s = store(tmp_path)
    a = s.save(talk(s.new(), "first"))
    b = s.save(talk(s.new(), "second"))
    s.rename(a.id, "  My   project ")
    assert [(c.id, c.title) for c in s.list()] == [(b.id, "second"), (a.id, "My project")]
    # A later message does not rename it back.
    s.save(talk(s.get(a.id), "answer", "next question"))
    assert s.get(a.id).title == "My project"
    with pytest.raises(SettingsError, match="cannot be empty"):
        s.rename(a.id, "   ")
    s.delete(a.id)
    assert [c.id for c in s.list()] == [b.id] and not s.path(a.id).exists()
    with pytest.raises(SettingsError, match="no chat"):
        s.rename(a.id, "gone")


def test_the_chat_open_last_comes_back_else_the_newest(tmp_path):
    s = store(tmp_path)
    assert s.last() is None
    a = s.save(talk(s.new(), "first"))
    b = s.save(talk(s.new(), "second"))
    assert s.last().id == b.id
    s.remember(a.id)
    assert ChatStore(s.root).last().id == a.id and mode(s.root / "last.json") == 0o600
    s.delete(a.id)
    assert s.last().id == b.id


def test_an_unreadable_chat_is_set_aside_and_left_out(tmp_path, capsys):
    s = store(tmp_path)
    a = s.save(talk(s.new(), "kept"))
    b = s.save(talk(s.new(), "torn"))
    s.path(b.id).write_text('{"format": 1, "id": "x", "mess', encoding="utf-8")
    assert [c.id for c in s.list()] == [a.id]
    assert "set aside" in capsys.readouterr().err
    assert any(".corrupt-" in p.name for p in s.root.iterdir())


@pytest.mark.parametrize("bad", ["../../etc/passwd", "", "20240101000000-zzzzzzzz", "x.json"])
def test_an_id_that_is_not_one_of_ours_is_refused(tmp_path, bad):
    with pytest.raises(SettingsError, match="not a chat id"):
        store(tmp_path).get(bad)


def test_titles_follow_the_first_message_cut_to_length():
    assert title_of(()) == UNTITLED
    assert title_of([{"role": "user", "content": " two\nlines "}]) == "two lines"
    long = title_of([{"role": "user", "content": "word " * 40}])
    assert len(long) == TITLE_CHARS and long.endswith("…")


def test_exports_hold_the_system_prompt_and_every_message(tmp_path):
    s = store(tmp_path)
    chat = s.save(talk(s.new("You answer in French."), "Hello?", "Bonjour !"))
    md = to_markdown(chat)
    assert md.startswith("# Hello?\n") and "## System prompt\n\nYou answer in French." in md
    assert md.index("## You\n\nHello?") < md.index("## Assistant\n\nBonjour !")
    assert Chat.from_json(json.loads(to_json(chat))) == chat
    assert file_stem(chat) == f"hello-{chat.id}"


def two_tabs(s: ChatStore, check: bool) -> Chat:
    """Two tabs read one chat; tab A saves a turn, then tab B saves its own turn over what it
    read. `check` False is the negative control: B writes at the revision on disk, as a store
    without the check (the last write wins) would."""
    chat = s.save(talk(s.new(), "q0", "a0"))
    tab_a, tab_b = s.get(chat.id), s.get(chat.id)
    s.save(talk(tab_a, "from A", "answer A"))
    turn_b = talk(tab_b, "from B", "answer B")
    if not check:
        turn_b = replace(turn_b, revision=s.get(chat.id).revision)
    s.save(turn_b)
    return s.get(chat.id)


def test_a_save_behind_the_chat_on_disk_is_refused_and_without_the_check_a_turn_is_lost(tmp_path):
    s = store(tmp_path)
    with pytest.raises(ChatChanged, match="changed elsewhere"):
        two_tabs(s, check=True)
    (kept,) = s.list()
    assert [m["content"] for m in kept.messages] == ["q0", "a0", "from A", "answer A"]
    assert kept.revision == 2
    # The negative control: with no check, B's save silently drops A's turn.
    lost = two_tabs(store(tmp_path / "blind"), check=False)
    assert "from A" not in [m["content"] for m in lost.messages]


def test_the_check_and_the_write_are_one_step_under_the_lock(tmp_path, monkeypatch):
    """Tab B saves while tab A's write is under way (between its check and its rename). Under
    the store's lock B waits, then finds A's turn and is refused. The negative control, with the
    lock taken away: B passes the check before A's rename, and A's rename drops B's turn."""
    def race(s: ChatStore, nested: bool) -> tuple[Chat, list]:
        chat = s.save(talk(s.new(), "q0"))
        tab_a, tab_b = s.get(chat.id), s.get(chat.id)
        outcome: list = []

        def save_b() -> None:
            try:
                outcome.append(s.save(talk(tab_b, "from B")))
            except ChatChanged as exc:
                outcome.append(exc)

        def during_a(step, tmp, out) -> None:
            if step == "written" and not outcome and threading.current_thread() is main:
                monkeypatch.setattr(atomic, "on_step", None)
                if nested:
                    save_b()  # no lock: B runs to its end inside A's write
                else:
                    b = threading.Thread(target=save_b)
                    b.start()
                    waiting.append(b)
                    b.join(0.5)  # still waiting for the lock: A goes on
        main, waiting = threading.current_thread(), []
        monkeypatch.setattr(atomic, "on_step", during_a)
        s.save(talk(tab_a, "from A"))
        for b in waiting:
            b.join()
        return s.get(chat.id), outcome

    kept, outcome = race(store(tmp_path), nested=False)
    assert isinstance(outcome[0], ChatChanged)
    assert [m["content"] for m in kept.messages] == ["q0", "from A"]
    blind = store(tmp_path / "blind")
    blind._lock = contextlib.nullcontext()
    lost, outcome = race(blind, nested=True)
    assert isinstance(outcome[0], Chat)  # B was told its turn is saved...
    assert [m["content"] for m in lost.messages] == ["q0", "from A"]  # ...and it is gone


def test_a_rename_and_a_system_prompt_move_no_revision_and_a_later_save_keeps_the_name(tmp_path):
    s = store(tmp_path)
    chat = s.save(talk(s.new("Be brief."), "first"))
    s.rename(chat.id, "Named")
    s.set_system(chat.id, "Be thorough.")
    again = s.get(chat.id)
    assert again.revision == chat.revision == 1 and again.system == "Be thorough."
    # A page that read the chat before the rename saves its turn; the name stays.
    saved = s.save(talk(chat, "reply"))
    assert saved.title == "Named" and saved.revision == 2


def test_a_chat_saved_before_revisions_opens_and_saves(tmp_path):
    """A chat file from before issue 64 (no revision, no pair): revision 0, then 1 when saved."""
    s = store(tmp_path)
    s.root.mkdir(mode=0o700)
    old = {"format": 1, "id": "20261201000000-0123abcd", "title": "old", "created": 1.0,
           "updated": 2.0, "system": "", "settings": {"temperature": 0.5}, "named": False,
           "messages": [{"role": "user", "content": "old question"}]}
    s.path(old["id"]).write_text(json.dumps(old), encoding="utf-8")
    chat = s.get(old["id"])
    assert chat.revision == 0 and chat.pair == {} and chat.settings == {"temperature": 0.5}
    assert s.save(talk(chat, "answer")).revision == 1


def test_a_save_of_a_chat_deleted_elsewhere_is_refused(tmp_path):
    s = store(tmp_path)
    chat = s.save(talk(s.new(), "q"))
    s.delete(chat.id)
    with pytest.raises(ChatChanged):
        s.save(talk(chat, "a"))
