"""Structured output on the real page in a headless Chromium, over the byte-level fake pair
(tests/byte_fake.py): a schema typed into the settings' box turns the setting on, the answer is
JSON that follows it, and the forced tokens show in their colour and in the panel; a schema the
constraint engine refuses is the page's error, and the message stays in its box."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.runtime.holder import PairHolder
from app.runtime.structured import SCHEMA
from engine.pair import Pair
from tests import appserver
from tests.byte_fake import ByteFake
from tests.test_app_browser import CHROMIUM, CHROMIUM_ARGS, set_slider

pytestmark = [pytest.mark.browser]

SCHEMA_DOC = {"type": "object",
              "properties": {"ok": {"type": "boolean"}, "name": {"enum": ["alpha", "beta"]}},
              "required": ["ok", "name"], "additionalProperties": False}


@pytest.fixture(scope="module")
def app_url():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    holder = PairHolder(Pair(ByteFake(seed=1), ByteFake(seed=1, noise=0.5)))
    with appserver.serve(holder) as url:
        yield url
    holder.close()


def open_chat(browser, app_url: str):
    page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
    page.goto(app_url)
    page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
    page.locator("#chat-settings button.label-wrap").click()
    # Fixed gamma 2: short drafts, so every round is verified before the answer's end.
    page.locator("#chat-drafter input").fill("draft")
    page.locator("#chat-drafter input").press("Enter")
    page.locator("#chat-policy input").fill("fixed")
    page.locator("#chat-policy input").press("Enter")
    set_slider(page, "chat-gamma", "2")
    return page


def type_schema(page, text: str) -> None:
    editor = page.locator("#chat-schema .cm-content")
    editor.click()
    editor.fill(text)
    page.wait_for_function(
        f"document.querySelector('#chat-output input[value=\"{SCHEMA}\"]').checked",
        timeout=10_000)


def test_a_schema_typed_on_the_page_shapes_the_answer(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = open_chat(browser, app_url)
            type_schema(page, json.dumps(SCHEMA_DOC))
            page.locator("#chat-input textarea").fill("Give me the record.")
            page.locator("#chat-send").click()
            page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]',
                                   timeout=60_000)
            answer = page.locator("#chatbot .message.bot, #chatbot [data-testid='bot']").last
            text = answer.inner_text().strip()
            forced = page.locator("#chat-tokens .tok-forced").count()
            panel = page.locator("#chat-metrics").inner_text()
            legend = page.locator("#chat-tokens .tandem-legend").inner_text()
        finally:
            browser.close()
    doc = json.loads(text)
    assert set(doc) == {"ok", "name"} and doc["name"] in ("alpha", "beta"), text
    assert forced > 0 and "forced" in panel and "forced by the grammar" in legend


def test_a_refused_schema_is_the_pages_error_and_the_message_stays(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = open_chat(browser, app_url)
            type_schema(page, '{"type": "object", "properties": {"a": {"type": "frob"}}}')
            page.locator("#chat-input textarea").fill("keep me")
            page.locator("#chat-send").click()
            page.wait_for_selector("text=Invalid type: frob", timeout=30_000)
            kept = page.locator("#chat-input textarea").input_value()
        finally:
            browser.close()
    assert kept == "keep me"
