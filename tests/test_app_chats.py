"""The chat tab's conversations without a browser (app/ui/chat.py, app/ui/chat_sidebar.py) over
the fake pair: a system prompt reaches the model, answers are saved as they go, retry, edit and
undo, the context meter, the overflow policies, and the prompt tokens the KV cache kept."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest

from app.runtime.holder import PairHolder
from app.ui import chat_sidebar, controls
from app.ui.chat import ChatTab, Values, pop_last_turn, respond, to_messages
from app.ui.state import StopFlags
from engine.pair import Pair
from loading.chats import ChatStore
from bench.fakes.backend import FakeBackend
from tests.byte_fake import AsciiFake
from tests.serve_fakes import byte_pair

# drafter, policy, gamma, temperature, top-k, top-p, min-p, seed, max tokens
GREEDY = ["draft", "fixed", 2, 0.0, 0, 1.0, 0.0, -1, 8]
REQUEST = SimpleNamespace(session_hash="s1")


class Recording(FakeBackend):
    """The fake model, keeping the text of each prompt it was asked to template."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.prompts: list[list[dict]] = []

    def chat_prompt(self, messages, tools=None):
        self.prompts.append([dict(m) for m in messages])
        return super().chat_prompt(messages, tools)


def tab(tmp_path, n_ctx: int = 4096) -> ChatTab:
    target = Recording(n_ctx=n_ctx)
    holder = PairHolder(Pair(target, FakeBackend(noise=0.5, n_ctx=n_ctx)))
    return ChatTab(holder, StopFlags(), ChatStore(tmp_path / "chats"))


def values(history, chat_id="", system="", overflow="drop-oldest", max_tokens=8,
           revision=None) -> tuple:
    """The chat event's values; `revision`: the chat's revision the page saw (an answer's last
    output), then the prediction box is empty."""
    tail = ("", revision) if revision is not None else ()
    return (history, *GREEDY[:-1], max_tokens, False, "off", "", chat_id, system, overflow, *tail)


def last(gen):
    *_, out = gen
    return out


def test_an_answer_is_saved_with_its_system_prompt_and_settings_and_reopens(tmp_path):
    t = tab(tmp_path)
    history, *_, meter, chat_id, _, _ = last(t.run(REQUEST, "hello", Values.of(values([], system="Be terse."))))
    assert t.holder.pair.target.backend.prompts[-1][0] == {"role": "system", "content": "Be terse."}
    saved = t.store.get(chat_id)
    assert [m["role"] for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1]["content"] == history[-1]["content"] and saved.title == "hello"
    assert saved.system == "Be terse." and saved.settings["max_tokens"] == 8
    assert saved.settings["overflow"] == "drop-oldest"
    # A reload (or a restart: a new store over the same folder) opens it again.
    again = ChatTab(t.holder, t.flags, ChatStore(t.store.root)).open_last()
    assert again[0] == chat_id and again[1] == list(saved.messages) and again[2] == "Be terse."
    assert 'data-used="' in meter and 'data-ctx="4096"' in meter


def test_a_second_turn_takes_its_prefix_from_the_cache(tmp_path):
    t = tab(tmp_path)
    history, _, panel, first, *_, chat_id, _, rev = last(t.run(REQUEST, "hello", Values.of(values([]))))
    assert first["prompt_cached_tokens"] == 0
    history, _, panel, stats, *_ = last(t.run(REQUEST, "more", Values.of(values(history, chat_id, revision=rev))))
    # At least the first turn's prompt (the fake's answer text does not tokenize back to the
    # ids it sampled, so the cache's match ends inside the answer; a real model's does).
    assert stats["prompt_cached_tokens"] >= first["prompt_tokens"]
    assert "prompt from cache" in panel and f"{stats['prompt_cached_tokens']} / {stats['prompt_tokens']}" in panel


def test_retry_sends_the_last_question_again_and_undo_takes_it_back(tmp_path):
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    second, *_, rev = last(t.run(REQUEST, "two", Values.of(values(first, chat_id, revision=rev))))
    again, _, _, stats, *_, rev = last(t.retry(REQUEST, *values(second, chat_id, revision=rev)))
    assert [m["content"] for m in again[:3]] == ["one", first[1]["content"], "two"] and len(again) == 4
    # Everything but the answer was still in the cache.
    assert stats["prompt_computed_tokens"] == 1
    history, box, _, _ = t.undo(*values(again, chat_id, revision=rev))
    assert box == "two" and history == first
    assert [m["content"] for m in t.store.get(chat_id).messages] == ["one", first[1]["content"]]


def test_edit_answers_the_changed_message_from_there(tmp_path):
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    second, *_, rev = last(t.run(REQUEST, "two", Values.of(values(first, chat_id, revision=rev))))
    edit = SimpleNamespace(index=2, value="deux")
    edited, *_ = last(t.edit(edit, REQUEST, *values(second, chat_id, revision=rev)))
    assert [m["content"] for m in edited if m["role"] == "user"] == ["one", "deux"]
    assert [m["content"] for m in t.store.get(chat_id).messages if m["role"] == "user"] == ["one", "deux"]


def test_a_chat_longer_than_the_context_goes_on_and_says_what_was_left_out(tmp_path):
    t = tab(tmp_path, n_ctx=128)
    history, chat_id, rev = [], "", 0
    for i in range(6):
        history, _, _, stats, _, meter, chat_id, _, rev = last(
            t.run(REQUEST, f"question number {i}", Values.of(values(history, chat_id, revision=rev))))
    assert len([m for m in history if m["role"] == "user"]) == 6
    assert "left out the oldest" in meter and "turns" in meter
    assert stats["prompt_tokens"] + 8 <= 128
    # The model read the system prompt-less newest turns only; the chat itself is whole.
    assert t.holder.pair.target.backend.prompts[-1][-1]["content"] == "question number 5"
    assert len(t.store.get(chat_id).messages) == 12
    with pytest.raises(gr.Error, match="start a new chat, choose another overflow policy"):
        last(t.run(REQUEST, "again", Values.of(values(history, chat_id, overflow="stop", revision=rev))))


def test_the_sidebar_renames_deletes_and_exports(tmp_path):
    t = tab(tmp_path)
    _, *_, a, _, _ = last(t.run(REQUEST, "first chat", Values.of(values([]))))
    _, *_, b, _, _ = last(t.run(REQUEST, "second chat", Values.of(values([]))))
    title, listing = t.rename(a, "Renamed")
    # A rename changes no message: the order stays newest first.
    assert title == "Renamed" and listing["choices"] == [("second chat", b), ("Renamed", a)]
    md = open(chat_sidebar.export(t.store, a, "md")["value"], encoding="utf-8").read()
    assert md.startswith("# Renamed") and "## You\n\nfirst chat" in md
    assert chat_sidebar.export(t.store, a, "json")["value"].endswith(".json")
    shown = t.delete(b)
    assert shown[0] == a and [c.id for c in t.store.list()] == [a]
    with pytest.raises(gr.Error, match="nothing to export"):
        chat_sidebar.export(t.store, "", "md")


def test_a_send_from_an_empty_window_never_overwrites_a_saved_chat(tmp_path):
    t = tab(tmp_path)
    _, *_, a, _, _ = last(t.run(REQUEST, "kept", Values.of(values([]))))
    # The page had the chat's id but not yet its messages (a send right after a reload).
    _, *_, b, _, _ = last(t.run(REQUEST, "other", Values.of(values([], chat_id=a))))
    assert b != a and [m["content"] for m in t.store.get(a).messages][0] == "kept"


def test_pop_last_turn_and_the_restored_settings():
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
               {"role": "user", "content": [{"type": "text", "text": "c"}]},
               {"role": "assistant", "content": "d"}]
    assert pop_last_turn(history) == (history[:2], "c")
    assert pop_last_turn([]) == ([], "")
    restored = chat_sidebar.restored(None, tuple(controls.WIDGETS))
    assert all(u == gr.update() for u in restored)


def test_respond_still_answers_without_a_system_prompt():
    holder = PairHolder(Pair(FakeBackend(), FakeBackend(noise=0.5)))
    *_, (history, _, panel, stats, box, meter) = respond(
        holder, StopFlags(), "s", "hi", [], controls.spec(holder.offer(), *GREEDY))
    assert stats["output_tokens"] == 8 and box == gr.update() and "context:" in meter


def test_the_predicted_output_box_drafts_and_its_tokens_show_as_drafted(tmp_path):
    """The settings' "predicted output" reaches the next answer: its tokens are drafted from it
    (the statistics count them), shown in the drafted colour, and the answer is unchanged."""
    pair = Pair(AsciiFake(seed=1), AsciiFake(seed=1, noise=0.5))
    t = ChatTab(PairHolder(pair), StopFlags(), ChatStore(tmp_path / "chats"))
    ask = values([], max_tokens=30)
    history, tokens, _, stats, *_ = last(t.run(REQUEST, "rewrite this",
                                               Values.of((ask[0], "lookup", *ask[2:]))))
    answer = history[-1]["content"]
    assert stats["accepted_prediction_tokens"] == 0
    again = Values.of((ask[0], "lookup", *ask[2:], answer))
    history, tokens, _, stats, *_ = last(t.run(REQUEST, "rewrite this", again))
    assert history[-1]["content"] == answer
    # Gamma 2: two predicted tokens and the bonus each round.
    assert stats["accepted_prediction_tokens"] >= 18 and stats["rejected_prediction_tokens"] == 0
    assert tokens.count('class="tok-draft"') >= stats["accepted_prediction_tokens"]


def test_a_reopened_chat_gives_back_every_setting_it_ran_with(tmp_path):
    """Drafter, policy, gamma, sampling, max tokens, the overflow policy, the history switch,
    the constraint (structured output and its schema), the predicted output and the system
    prompt: saved with the answer, given back to the controls when the chat opens."""
    # Bytes as tokens: the constraint's grammar works on them.
    t = ChatTab(PairHolder(byte_pair()), StopFlags(), ChatStore(tmp_path / "chats"))
    schema = '{"type": "object"}'
    ran = ("lookup", "fixed", 3, 0.0, 0, 1.0, 0.0, 7, 8, True, "JSON schema", schema, "",
           "Be terse.", "stop", "def f(): pass")
    *_, chat_id, _, _ = last(t.run(REQUEST, "hello", Values.of(([], *ran))))
    shown = dict(zip(t_shown_names(), ChatTab(t.holder, t.flags, ChatStore(t.store.root))
                     .open(chat_id)))
    assert shown["system"] == "Be terse." and shown["revision"] == 2
    restored = {n: shown[n]["value"] for n in chat_sidebar.RESTORED}
    assert restored == dict(zip(chat_sidebar.RESTORED, (*ran[:9], "stop", True, "JSON schema", schema,
                                                        "def f(): pass")))
    # The same pair as it ran on: no line about another.
    assert shown["notice"] == ""


def t_shown_names() -> list[str]:
    """The names of ChatTab.show's values, in its order."""
    return ["chat_id", "messages", "system", "title", "list", "meter", "panel", "tokens",
            *chat_sidebar.RESTORED, "revision", "notice"]


def test_a_chat_that_ran_on_another_pair_says_which_settings_differ(tmp_path):
    """A chat saved on another pair and context opens with one line naming what differs; a
    drafter the loaded pair does not offer is left as the pair's and named there too."""
    t = tab(tmp_path)
    *_, chat_id, _, _ = last(t.run(REQUEST, "hello", Values.of(values([]))))
    chat = t.store.get(chat_id)
    assert chat.pair == {"target": t.holder.status.target, "draft": t.holder.status.draft,
                         "ctx": 4096}
    t.store.save(replace(chat, pair={**chat.pair, "target": "big-7b.gguf", "ctx": 8192},
                         settings={**chat.settings, "drafter": "early-exit"}))
    shown = dict(zip(t_shown_names(), t.open(chat_id)))
    line = shown["notice"]
    assert "target big-7b.gguf (now fake" in line and "--ctx 8192 (now 4096)" in line
    assert "drafter early-exit (this pair does not offer it)" in line and "draft " not in line
    assert shown["drafter"] == gr.update() and shown["gamma"] == {"__type__": "update", "value": 2}
    # After a load sets the pairing record's choice, the open chat's comes back.
    drafter, policy, gamma, notice = t.reapply(chat_id)
    assert drafter == gr.update() and policy["value"] == "fixed" and notice == line


def test_a_page_behind_the_saved_chat_is_refused_and_saves_nothing(tmp_path):
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    # Another tab answers in the same chat.
    last(t.run(REQUEST, "other tab", Values.of(values(first, chat_id, revision=rev))))
    kept = t.store.get(chat_id)
    for stale in (lambda: last(t.run(REQUEST, "two", Values.of(values(first, chat_id,
                                                                        revision=rev)))),
                  lambda: t.undo(*values(first, chat_id, revision=rev))):
        with pytest.raises(gr.Error, match="Changed elsewhere.*Reload"):
            stale()
        assert t.store.get(chat_id) == kept


def test_a_second_answer_in_a_chat_is_refused_while_one_runs(tmp_path):
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    running = t.run(REQUEST, "two", Values.of(values(first, chat_id, revision=rev)))
    *_, rev = next(running)  # the answer has started: its question is saved
    with pytest.raises(gr.Error, match="answering already"):
        last(t.run(REQUEST, "three", Values.of(values(first, chat_id, revision=rev))))
    history, *_, rev = last(running)
    assert [m["content"] for m in t.store.get(chat_id).messages if m["role"] == "user"] == [
        "one", "two"]
    # Once it has ended, the chat takes the next.
    *_, rev = last(t.run(REQUEST, "three", Values.of(values(history, chat_id, revision=rev))))
    assert t.store.get(chat_id).revision == rev


def test_an_answer_whose_chat_changed_while_it_ran_is_kept_as_a_new_chat(tmp_path):
    """Another writer (a second server on the store) saves the chat while an answer runs: the
    answer's save is refused, so the page's conversation is kept whole as a new chat, a warning
    names it, and the other writer's turn stays in the first."""
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    running = t.run(REQUEST, "two", Values.of(values(first, chat_id, revision=rev)))
    next(running)
    elsewhere = t.store.get(chat_id)
    t.store.save(replace(elsewhere, messages=(*elsewhere.messages,
                                              {"role": "assistant", "content": "from elsewhere"})))
    with pytest.warns(UserWarning, match="saved as a new chat"):
        history, *_, copy_id, listing, rev = last(running)
    assert copy_id != chat_id and t.store.get(copy_id).revision == rev
    copy = t.store.get(copy_id)
    assert copy.messages == tuple(to_messages(history)) and copy.title == "one (copy)"
    assert t.store.get(chat_id).messages[-1]["content"] == "from elsewhere"
    assert {i for _, i in listing["choices"]} == {chat_id, copy_id}


def test_an_answer_that_fails_midway_leaves_the_page_at_the_chats_revision(tmp_path):
    """A generation that fails after its question was saved (here the fake's vocabulary and a
    JSON schema disagree) is saved as it stands, hands the page that save's revision, then its
    error: the page's next send is not refused as if another tab had changed the chat."""
    t = tab(tmp_path)
    first, *_, chat_id, _, rev = last(t.run(REQUEST, "one", Values.of(values([]))))
    frames = []
    ask = list(values(first, chat_id, revision=rev))
    ask[11], ask[12] = "JSON schema", '{"type": "object"}'
    with pytest.raises(gr.Error, match="grammar"):
        for frame in t.run(REQUEST, "two", Values.of(tuple(ask))):
            frames.append(frame)
    history, *_, rev = frames[-1]
    assert rev == t.store.get(chat_id).revision
    *_, rev = last(t.run(REQUEST, "three", Values.of(values(history, chat_id, revision=rev))))
    assert [m["content"] for m in t.store.get(chat_id).messages if m["role"] == "user"] == [
        "one", "two", "three"]


def test_only_the_first_frame_empties_the_textbox_so_what_is_typed_meanwhile_is_kept():
    """The question leaves the box once; no later frame (the answer's stream, its end) empties
    it again, else a next question typed while the answer ran would be lost."""
    holder = PairHolder(Pair(FakeBackend(), FakeBackend(noise=0.5)))
    frames = list(respond(holder, StopFlags(), "s", "hi", [],
                          controls.spec(holder.offer(), *GREEDY)))
    assert len(frames) >= 2 and frames[0][4] == ""
    assert all(f[4] == gr.update() for f in frames[1:])
