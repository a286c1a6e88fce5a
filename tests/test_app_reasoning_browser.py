"""A reasoning model's thought on the real page in a headless Chromium, over the fake whose
template thinks (tests/thinking_fake.py): the answer shows with its thought above it, folded
under a title that counts its tokens, and opens on a click (Gradio's own thought message)."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.holder import PairHolder
from tests import appserver
from tests.agent_fake import SENTENCE
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_reasoning import THOUGHT_TOKENS, thinking_pair
from tests.thinking_fake import THOUGHT

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def app_url():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    holder = PairHolder(thinking_pair())
    with appserver.serve(holder) as url:
        yield url
    holder.close()


def test_the_thought_shows_folded_above_the_answer_with_its_token_count(app_url):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    title = f"thought · {THOUGHT_TOKENS} tokens"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
            page.goto(app_url)
            page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
            page.locator("#chat-input textarea").fill("Hi")
            page.locator("#chat-send").click()
            page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]',
                                   timeout=60_000)
            chat = page.locator("#chatbot")
            chat.get_by_text(title).wait_for(timeout=10_000)
            answered = chat.get_by_text(SENTENCE).is_visible()
            # The thought folds once its status turns "done"; Gradio slides it shut, so a
            # loaded page can still show it for a moment: wait for it to be hidden.
            try:
                chat.get_by_text(THOUGHT).wait_for(state="hidden", timeout=10_000)
                folded = True
            except PlaywrightTimeout:
                folded = False
            chat.get_by_text(title).click()
            chat.get_by_text(THOUGHT).wait_for(state="visible", timeout=10_000)
        finally:
            browser.close()
    assert answered and folded
