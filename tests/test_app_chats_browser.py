"""The chat tab's conversations in a real headless Chromium (issue 47), over the fake pair: a
chat survives a reload and a restart with its system prompt, and is renamed, exported and
deleted from the sidebar; retry, edit and undo; a chat longer than the context goes on and
says what was left out; two tabs keep their own chats in one list. Each test asserts what the
person sees: the sidebar's titles, the messages, the context meter, the metrics panel."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from app.runtime.defaults import DEFAULT_GAMMA
from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.access import Access
from app.serve.server import launch
from app.ui import build_app, page_mounter
from bench.fakes.backend import FakeBackend
from engine.pair import Pair
from loading.chats import ChatStore
from tests import appserver
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, set_slider

pytestmark = [pytest.mark.browser]

# The metrics panel of an answer that ended after `mark_panel` was called.
DONE = '#chat-metrics .tandem-metrics[data-state="done"]:not([data-old])'


@contextmanager
def served(chats: Path, n_ctx: int = 512) -> Iterator[str]:
    """The page over a fresh fake pair, saving its chats in `chats`."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    pair = Pair(FakeBackend(seed=1, n_ctx=n_ctx), FakeBackend(seed=1, noise=0.5, n_ctx=n_ctx))
    holder = PairHolder(pair, queue=GenerationQueue(4))
    demo = build_app(holder, chats=ChatStore(chats))
    running = launch(page_mounter(demo), Access("127.0.0.1", appserver.free_port(), keyed=("/v1",)))
    try:
        yield running.url
    finally:
        running.close()
        holder.close()


@contextmanager
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(b, url: str, max_tokens: str = "8"):
    page = b.new_context(viewport={"width": 1280, "height": 1000}).new_page()
    page.goto(url)
    page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
    # The page's load opens the chat open last; wait until it has answered.
    # (Null-safe: a predicate that throws ends the wait at once, and the element may not be drawn
    # yet on a busy machine.)
    page.wait_for_function("(document.querySelector('#chat-context .tandem-context')?.dataset.ctx"
                           " ?? '') !== ''",
                           timeout=30_000)
    page.locator("#chat-settings button.label-wrap").click()
    set_slider(page, "chat-max-tokens", max_tokens)
    return page


def mark_panel(page) -> None:
    """Mark the metrics panel shown now: the next answer's panel replaces it."""
    page.evaluate("document.querySelector('#chat-metrics .tandem-metrics').dataset.old = '1'")


def send(page, text: str) -> None:
    """Type and send a message; wait for its answer to end."""
    before = page.locator("#chatbot [data-testid=bot]").count()
    mark_panel(page)
    page.locator("#chat-input textarea").fill(text)
    page.locator("#chat-send").click()
    wait_answer(page, before + 1)


def wait_answer(page, bots: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('#chatbot [data-testid=bot]').length == {bots}",
                           timeout=60_000)
    page.wait_for_selector(DONE, timeout=60_000)


def questions(page) -> list[str]:
    return [t.strip() for t in page.locator("#chatbot [data-testid=user]").all_inner_texts()]


def titles(page) -> list[str]:
    return [t.strip() for t in page.locator("#chat-list label").all_inner_texts()]


def test_a_chat_survives_a_reload_and_a_restart_and_is_renamed_exported_and_deleted(tmp_path):
    chats = tmp_path / "chats"
    with served(chats) as url, browser() as b:
        page = open_page(b, url)
        page.locator("#chat-preset input").click()
        page.get_by_role("option", name="concise coder").click()
        page.wait_for_function("document.querySelector('#chat-system textarea')?.value"
                               ".startsWith('You are an expert')")
        send(page, "How do I sort a list?")
        send(page, "And in reverse?")
        assert titles(page) == ["How do I sort a list?"]
        page.reload()
        page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 2",
                               timeout=30_000)
        assert questions(page) == ["How do I sort a list?", "And in reverse?"]
        assert page.locator("#chat-system textarea").input_value().startswith("You are an expert")
        page.locator("#chat-title input").fill("Sorting")
        page.locator("#chat-rename").click()
        page.wait_for_function("[...document.querySelectorAll('#chat-list label')].some(l => l.innerText.includes('Sorting'))")
    with served(chats) as url, browser() as b:  # a restart: a new server over the same store
        page = open_page(b, url)
        page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 2",
                               timeout=30_000)
        assert titles(page) == ["Sorting"] and questions(page)[0] == "How do I sort a list?"
        with page.expect_download() as got:
            page.locator("#chat-export-md").click()
            page.locator("#chat-export a").first.click()
        text = Path(got.value.path()).read_text(encoding="utf-8")
        assert text.startswith("# Sorting") and "## You\n\nAnd in reverse?" in text
        assert "## System prompt\n\nYou are an expert" in text
        page.locator("#chat-delete").click()
        page.wait_for_function("document.querySelectorAll('#chat-list label').length == 0")
        assert questions(page) == []
    assert not list(chats.glob("2*.json"))


def test_retry_edit_and_undo(tmp_path):
    with served(tmp_path / "chats") as url, browser() as b:
        page = open_page(b, url)
        send(page, "first question")
        send(page, "second question")
        mark_panel(page)
        page.locator('#chatbot button[aria-label="Retry"]').last.click()
        wait_answer(page, 2)
        assert questions(page) == ["first question", "second question"]
        # A retry reads everything before the answer from the cache.
        panel = page.locator("#chat-metrics").inner_text()
        assert "prompt from cache" in panel and "prompt computed\n1" in panel, panel
        mark_panel(page)
        page.locator('#chatbot button[aria-label="Edit"]').first.click()
        page.locator("#chatbot textarea.edit-textarea").fill("an edited question")
        page.locator('#chatbot button[aria-label="Submit"]').click()
        page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 1")
        wait_answer(page, 1)
        assert questions(page) == ["an edited question"]
        send(page, "one more")
        page.locator('#chatbot button[aria-label="Undo"]').last.click()
        page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 1")
        assert page.locator("#chat-input textarea").input_value() == "one more"
        page.reload()
        page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 1",
                               timeout=30_000)
        assert questions(page) == ["an edited question"]


def test_a_chat_longer_than_the_context_goes_on_and_says_what_was_left_out(tmp_path):
    with served(tmp_path / "chats", n_ctx=192) as url, browser() as b:
        page = open_page(b, url, max_tokens="16")
        for i in range(6):
            send(page, f"question number {i} about the context")
        meter = page.locator("#chat-context .tandem-context")
        assert int(meter.get_attribute("data-ctx")) == 192
        assert 0 < int(meter.get_attribute("data-used")) <= 192
        assert "left out the oldest" in meter.inner_text() and "system prompt is kept" in meter.inner_text()
        # Every question is still on the page; only the model's view moved on.
        assert len(questions(page)) == 6
        page.locator("#chat-overflow input").click()
        page.get_by_role("option", name="stop with a message").click()
        page.locator("#chat-input textarea").fill("one question too many")
        page.locator("#chat-send").click()
        page.wait_for_selector("text=start a new chat, choose another overflow policy", timeout=30_000)


def test_two_tabs_keep_their_own_chats_in_one_list(tmp_path):
    with served(tmp_path / "chats") as url, browser() as b:
        ada, bob = open_page(b, url), open_page(b, url)
        send(ada, "Ada asks about lists")
        bob.locator("#chat-new").click()
        send(bob, "Bob asks about dates")
        send(ada, "Ada again")
        assert titles(ada) == ["Ada asks about lists", "Bob asks about dates"]
        assert questions(ada) == ["Ada asks about lists", "Ada again"]
        assert questions(bob) == ["Bob asks about dates"]
        # Bob opens Ada's chat from the list and sees it whole.
        bob.locator("#chat-list label", has_text="Ada asks about lists").click()
        bob.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 2")
        assert questions(bob) == ["Ada asks about lists", "Ada again"]


def choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in a dropdown, as a person does."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_function(f"document.querySelector('#{elem_id} input')?.value == '{option}'")


def wait_choices(page, drafter: str, policy: str, gamma: str) -> None:
    """Wait until the chat's drafter, policy and gamma controls show these."""
    page.wait_for_function(
        f"document.querySelector('#chat-drafter input')?.value == '{drafter}' && "
        f"document.querySelector('#chat-policy input')?.value == '{policy}' && "
        f"document.querySelector('#chat-gamma input[type=range]')?.value == '{gamma}'",
        timeout=30_000)


def test_a_reopened_chat_runs_with_the_drafter_policy_and_gamma_it_was_saved_with(tmp_path,
                                                                                  monkeypatch):
    """Issue 64: a chat opened from the list, and the chat a restarted server opens, give the
    controls back their drafter, policy and gamma (over the pairing record's choice, which a
    page's load sets first), and the next answer runs with them: the engine is asked for them
    (a spy on the chat's generate) and the metrics panel names the drafter. Restarted on
    another context length, the chat says so in one line."""
    from app.ui import chat as chat_module
    from app.ui.chat import ChatTab

    ran: list[tuple] = []
    real_generate = chat_module.generate

    def spy(pair, spec, *args, **kw):
        ran.append((spec.drafter, spec.policy, spec.gamma))
        return real_generate(pair, spec, *args, **kw)
    monkeypatch.setattr(chat_module, "generate", spy)
    # The page's load sets the pairing record's choice, then the open chat's (ChatTab.reapply).
    reapplied = threading.Event()
    real_reapply = ChatTab.reapply

    def reapply(self, chat_id):
        try:
            return real_reapply(self, chat_id)
        finally:
            reapplied.set()
    monkeypatch.setattr(ChatTab, "reapply", reapply)
    chats = tmp_path / "chats"
    with served(chats) as url, browser() as b:
        page = open_page(b, url)
        # The load's choices are on the page before the person changes them.
        assert reapplied.wait(60)
        choose(page, "chat-drafter", "lookup")
        choose(page, "chat-policy", "fixed")
        # A policy picked by hand starts from its own gamma; then the person sets it.
        page.wait_for_function("document.querySelector('#chat-gamma input[type=range]')?.value"
                               f" == '{DEFAULT_GAMMA['fixed']}'")
        set_slider(page, "chat-gamma", "3")
        send(page, "saved with prompt lookup")
        assert ran[-1] == ("lookup", "fixed", 3)
        page.locator("#chat-new").click()
        choose(page, "chat-drafter", "draft")
        set_slider(page, "chat-gamma", "5")
        send(page, "another chat, with the draft model")
        assert ran[-1] == ("draft", "fixed", 5)
        page.locator("#chat-list label", has_text="saved with prompt lookup").click()
        wait_choices(page, "lookup", "fixed", "3")
        send(page, "and once more")
        assert ran[-1] == ("lookup", "fixed", 3)
        assert "lookup" in page.locator("#chat-metrics").inner_text()
    reapplied.clear()
    with served(chats) as url, browser() as b:  # a restart: the page opens the chat open last
        page = open_page(b, url)
        assert reapplied.wait(60)
        wait_choices(page, "lookup", "fixed", "3")
        assert questions(page) == ["saved with prompt lookup", "and once more"]
        send(page, "after a restart")
        assert ran[-1] == ("lookup", "fixed", 3)
        # The same pair as it ran on: no line about another pair.
        assert page.locator("#chat-notice").inner_text().strip() == ""
    with served(chats, n_ctx=384) as url, browser() as b:  # restarted with another --ctx
        page = open_page(b, url)
        page.locator("#chat-differs").wait_for(timeout=30_000)
        assert "--ctx 512 (now 384)" in page.locator("#chat-notice").inner_text()


def refused(page) -> None:
    """Wait for the visible "changed elsewhere" refusal, then close it."""
    toast = page.locator(".toast-body", has_text="Changed elsewhere")
    toast.wait_for(timeout=30_000)
    toast.locator(".toast-close").click()


def test_two_tabs_on_one_chat_lose_no_turn(tmp_path):
    """Issue 64: two pages on one chat. The page behind the saved chat is refused with a visible
    "changed elsewhere" and sends nothing; Reload shows the other page's turns and keeps what
    was typed, which then goes in after them. Every question is kept once, in order, on disk
    and on both pages."""
    chats = tmp_path / "chats"
    with served(chats) as url, browser() as b:
        ada = open_page(b, url)
        send(ada, "Ada one")
        bob = open_page(b, url)  # opens the chat open last: Ada's
        bob.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 1",
                              timeout=30_000)
        send(ada, "Ada two")
        bob.locator("#chat-input textarea").fill("Bob one")
        bob.locator("#chat-send").click()
        refused(bob)
        assert questions(bob) == ["Ada one"]
        bob.locator("#chat-reload").click()
        bob.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 2",
                              timeout=30_000)
        assert bob.locator("#chat-input textarea").input_value() == "Bob one"
        mark_panel(bob)
        bob.locator("#chat-send").click()
        wait_answer(bob, 3)
        ada.locator("#chat-input textarea").fill("Ada three")
        ada.locator("#chat-send").click()
        refused(ada)
        ada.locator("#chat-reload").click()
        ada.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 3",
                              timeout=30_000)
        mark_panel(ada)
        ada.locator("#chat-send").click()
        wait_answer(ada, 4)
        order = ["Ada one", "Ada two", "Bob one", "Ada three"]
        assert questions(ada) == order
        bob.locator("#chat-reload").click()
        bob.wait_for_function("document.querySelectorAll('#chatbot [data-testid=user]').length == 4",
                              timeout=30_000)
        assert questions(bob) == order
        assert titles(ada) == ["Ada one"]
    (saved,) = ChatStore(chats).list()
    assert [m["role"] for m in saved.messages] == ["user", "assistant"] * 4
    assert [m["content"] for m in saved.messages if m["role"] == "user"] == order
