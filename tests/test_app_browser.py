"""The page in a real headless Chromium (Debian's, driven by Playwright): load it, send a message,
watch the answer stream and the metrics panel change, and save a screenshot. The page's requests
carry its own origin and pass the server's Host and Origin checks (app/serve/access.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.runtime.holder import PairHolder
from tests import appserver

pytestmark = [pytest.mark.browser, pytest.mark.real]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# Records every change of the metrics panel and of the last chat message, as the page sees them.
OBSERVE = """() => {
  window.__panel = []; window.__answer = [];
  const panel = document.querySelector('#chat-metrics');
  const bot = document.querySelector('#chatbot');
  new MutationObserver(() => {
    const m = panel.querySelector('.tandem-metrics');
    if (m) window.__panel.push([m.dataset.state, Number(m.dataset.tokens || 0)]);
  }).observe(panel, {subtree: true, childList: true, attributes: true, characterData: true});
  new MutationObserver(() => {
    const msgs = bot.querySelectorAll('.message.bot, [data-testid="bot"]');
    if (msgs.length) window.__answer.push(msgs[msgs.length - 1].innerText.length);
  }).observe(bot, {subtree: true, childList: true, characterData: true});
}"""


def set_slider(page, elem_id: str, value: str) -> None:
    """Set a slider; a busy page can drop an input event, so set it until its number box agrees."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(5):
        # Typed into the number box and committed with Enter, as a user would; the range then
        # follows. Filling the range alone left the value sent behind the box now and then.
        box = page.locator(f"#{elem_id} input[type=number]")
        box.fill(value)
        box.press("Enter")
        box.blur()
        try:
            page.wait_for_function(f"document.querySelector('#{elem_id} input[type=range]')?.value == '{value}'",
                                   timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the page did not take {elem_id} = {value}")


@pytest.fixture(scope="module")
def app_url():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    holder = PairHolder()
    appserver.load_small_pair(holder)
    with appserver.serve(holder) as url:
        yield url
    holder.close()


def test_chat_in_a_browser(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            finished = []
            page.on("requestfinished", lambda request: finished.append(request))
            page.goto(app_url)
            page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
            assert page.locator('#chat-metrics .tandem-metrics[data-state="idle"]').count() == 1
            # Few tokens: the machine is shared and the test only needs a handful of rounds.
            page.locator("#chat-settings button.label-wrap").click()
            for name, value in (("max-tokens", "16"), ("gamma", "2")):
                set_slider(page, f"chat-{name}", value)
            page.evaluate(OBSERVE)
            page.locator("#chat-input textarea").fill("Write a Python function that adds two numbers.")
            page.locator("#chat-send").click()
            page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]', timeout=240_000)
            panel = page.evaluate("window.__panel")
            answer = page.evaluate("window.__answer")
            page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
            # The page's POSTs say where they come from, and were answered.
            sent = [(r.header_value("origin"), r.response().status) for r in finished
                    if r.method == "POST"]
        finally:
            browser.close()

    origin = app_url.rstrip("/")
    assert sent and all(o == origin and status < 400 for o, status in sent), sent

    states = [s for s, _ in panel]
    tokens = [n for _, n in panel]
    assert "running" in states and states[-1] == "done", panel
    assert tokens[-1] == 16 and 0 < max(n for s, n in panel if s == "running") <= 16, panel
    grown = [n for n in answer if n > 0]
    assert len(set(grown)) >= 2, answer
    assert (tmp_path / "chat.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def found_app_url(tmp_path_factory):
    """The app with nothing loaded, on a machine whose Ollama store holds the embedded pair
    (blobs linking to the store's files, as link-farm tools make them)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    from models import embedded
    from tests import fakestores

    target, draft = embedded.ensure()
    ollama = tmp_path_factory.mktemp("ollama")
    for tag, path in (("1.5b", target), ("0.5b", draft)):
        blob = fakestores.ollama(ollama, "qwen2.5-coder", tag, None, digest=f"{tag[0]}" * 64)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.symlink_to(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OLLAMA_MODELS", str(ollama))
        holder = PairHolder()
        with appserver.serve(holder) as url:
            yield url
        holder.close()


# Long: the default suite has the same pick-pair-load flow without a browser (test_wizard_found.py).
@pytest.mark.long
def test_a_model_found_on_disk_is_picked_paired_and_loaded_in_the_browser(found_app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(found_app_url)
            page.wait_for_selector('#tandem-status[data-state="empty"]', timeout=60_000)
            page.get_by_role("tab", name="Models").click()
            page.locator("#wizard-found input").click()
            page.get_by_role("option", name="qwen2.5-coder:1.5b").first.click()
            # The target field takes the found name; the best draft on disk is picked for it.
            page.wait_for_function("document.querySelector('#wizard-target-file textarea')?.value"
                                   " == 'qwen2.5-coder:1.5b'", timeout=30_000)
            page.wait_for_function("document.querySelector('#wizard-draft-file textarea')?.value"
                                   " == 'qwen2.5-coder:0.5b'", timeout=60_000)
            page.locator("#wizard-load").click()
            page.wait_for_selector("#wizard-load-note :text('Loaded')", timeout=240_000)
            page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=30_000)
            banner = page.locator("#tandem-status").inner_text()
        finally:
            browser.close()
    assert "qwen2.5-coder:1.5b" in banner and "qwen2.5-coder:0.5b" in banner
