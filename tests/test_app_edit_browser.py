"""A first chat request that edits pasted code drafts its copies, in a real headless Chromium on
this machine's CPU with the browser open beside the app (issue 62): nothing calibrated, no
evidence and no history before it (fresh stores), so the request measures the pair's costs
itself, on a machine that may be busy (a busy calibration is used, not kept), and the controller
starts from its priors. The panel must show drafted tokens, read from the page: the acceptance
chart's drafted counts and the answer's tokens coloured as accepted drafts.

Over the small real model (the embedded draft as both target and draft, as test_app_browser.py)
in the default suite, and over the embedded pair (Qwen2.5-Coder 1.5B with its 0.5B draft) behind
`long`. Only what happened is asserted, never how fast."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.runtime.holder import PairHolder
from engine.backend import ModelConfig
from tests import appserver
from tests.test_app_browser import CHROMIUM, set_slider
from tests.test_app_chats_browser import browser

pytestmark = [pytest.mark.browser, pytest.mark.real]

# A function whose body runs well past the longest copy (64 tokens) after the line the edit
# changes: the answer copies it back, so even a first request has copies worth drafting once
# the first has been watched (engine/control/controller.py `_watch`).
FUNCTION = '''def summarize_orders(orders):
    totals = {}
    counts = {}
    largest = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"]
        totals[customer] = totals.get(customer, 0) + amount
        counts[customer] = counts.get(customer, 0) + 1
        if amount > largest.get(customer, 0):
            largest[customer] = amount
    report = []
    for customer in sorted(totals):
        average = totals[customer] / counts[customer]
        report.append({
            "customer": customer,
            "total": totals[customer],
            "orders": counts[customer],
            "average": round(average, 2),
            "largest": largest[customer],
        })
    return report
'''
EDIT = ("Rename the function to `order_report`; change nothing else. Reply with the whole "
        f"function only.\n\n```python\n{FUNCTION}```")
# Enough for the answer's opening, the renamed line and the body copied back (about 200 tokens).
MAX_TOKENS = "224"
DONE = '#chat-metrics .tandem-metrics[data-state="done"]'


def small_pair() -> tuple[Path, Path]:
    path = appserver.small_model()
    return path, path


def embedded_pair() -> tuple[Path, Path]:
    from tests.realmodels import embedded_pair as pair
    return pair()


@pytest.fixture(params=[pytest.param(small_pair, id="small"),
                        pytest.param(embedded_pair, id="embedded", marks=pytest.mark.long)])
def first_app(request, tmp_path, monkeypatch):
    """The app over a freshly loaded pair with nothing kept for it: no calibration, no evidence,
    no history of past requests."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    for env in ("TANDEM_CALIBRATIONS", "TANDEM_EVIDENCE", "TANDEM_HISTORY"):
        monkeypatch.setenv(env, str(tmp_path / env.lower()))
    target, draft = request.param()
    holder = PairHolder()
    error = holder.load(ModelConfig(str(target), n_ctx=appserver.N_CTX, n_threads=2),
                        ModelConfig(str(draft), n_ctx=appserver.N_CTX, n_threads=2))
    assert error is None, error
    with appserver.serve(holder) as url:
        yield url
    holder.close()


def drafted_in_chart(chart_text: str) -> int:
    """Drafted tokens as the acceptance chart shows them: "83% of 12" at each draft position
    counts the rounds that drafted that far, so the counts add up to the tokens drafted."""
    return sum(int(n) for n in re.findall(r"\d+% of (\d+)", chart_text))


def test_drafted_in_chart_adds_each_positions_count():
    assert drafted_in_chart("#1\n100% of 3\n#2\n67% of 3\n#3\n50% of 2") == 8
    assert drafted_in_chart("no drafted tokens yet") == 0


def test_a_first_chat_request_that_edits_pasted_code_drafts_its_copies(first_app, tmp_path):
    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(first_app)
        page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=60_000)
        page.locator("#chat-settings button.label-wrap").click()
        # Greedy, the default drafter and policy: only the answer's length is set.
        set_slider(page, "chat-temperature", "0")
        set_slider(page, "chat-max-tokens", MAX_TOKENS)
        page.locator("#chat-input textarea").fill(EDIT)
        page.locator("#chat-send").click()
        # The first request calibrates the pair (minutes on a busy 2-core machine).
        page.wait_for_selector(DONE, timeout=900_000)
        chart = page.locator("#chat-metrics .tandem-chart").inner_text()
        panel = page.locator("#chat-metrics").inner_text()
        accepted = page.locator("#chat-tokens .tok-draft").count()
        answer = page.locator("#chatbot [data-testid=bot]").last.inner_text()
        page.screenshot(path=str(tmp_path / "edit.png"), full_page=True)
    # The answer is the edit: the renamed function, its body copied back.
    assert "order_report" in answer and "largest[customer] = amount" in answer, answer
    drafted = drafted_in_chart(chart)
    assert drafted > 0, panel
    # Copies of the body were accepted: the panel colours them as drafts.
    assert 0 < accepted <= drafted, panel
