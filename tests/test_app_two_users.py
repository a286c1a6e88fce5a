"""The app under two users (issue 38): two browser sessions (separate Chromium contexts, as two
people on two machines would be) chat through the real page at the same time over one server.
Both get their answers; neither sees the other's messages; each session's statistics are its
own (each asks for a different answer length, and its panel and stats show that length).

The pair is the fake one with a few milliseconds per decode, so the two answers overlap in
time without a model to load.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from engine.pair import Pair
from tests import appserver
from bench.fakes.backend import FakeBackend
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, set_slider

pytestmark = [pytest.mark.browser]

DECODE_S = 0.02


class SlowBackend(FakeBackend):
    """The fake model, taking DECODE_S a decode, so an answer lasts long enough to overlap."""

    def decode(self, tokens, pos, rows):
        time.sleep(DECODE_S)
        return super().decode(tokens, pos, rows)


@pytest.fixture(scope="module")
def app_url():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    pair = Pair(SlowBackend(seed=1, n_ctx=512), SlowBackend(seed=1, noise=0.5, n_ctx=512))
    holder = PairHolder(pair, queue=GenerationQueue(4))
    with appserver.serve(holder) as url:
        yield url
    holder.close()


USERS = {"ada": ("Ada asks about sorting lists", "24"),
         "bob": ("Bob asks about parsing dates", "40")}


def test_two_sessions_chat_at_once_and_keep_to_their_own(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            pages = {}
            for user, (_, tokens) in USERS.items():
                page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                page.goto(app_url)
                page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
                page.locator("#chat-settings button.label-wrap").click()
                set_slider(page, "chat-max-tokens", tokens)
                page.locator("#chat-input textarea").fill(USERS[user][0])
                pages[user] = page
            for page in pages.values():  # both sent before either answer ends
                page.locator("#chat-send").click()
            for user, page in pages.items():
                page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]',
                                       timeout=120_000)
            seen = {user: page.locator("#chatbot").inner_text() for user, page in pages.items()}
            panels = {user: int(page.locator("#chat-metrics .tandem-metrics")
                                .get_attribute("data-tokens") or 0)
                      for user, page in pages.items()}
        finally:
            browser.close()

    for user, (message, tokens) in USERS.items():
        other = next(m for u, (m, _) in USERS.items() if u != user)
        assert message in seen[user] and other not in seen[user], seen
        # Its own answer length, not the other session's.
        assert panels[user] == int(tokens), panels
