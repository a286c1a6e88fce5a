"""Save one screenshot per tab of the app into docs/screenshots/ (chat, side by side, models).

Launches the app on a free local port with the embedded pair (or --target/--draft), drives
Debian's Chromium through Playwright with short chats (two kept in the sidebar, then two turns
under a system prompt preset), one side-by-side run and a catalog check in the wizard, and
writes chat.png, compare.png and models.png (`--tabs chat` for the chat tab's alone).

    .venv/bin/python -m scripts.screenshots [--small] [--max-tokens 48] [--policy fixed] [--out docs/screenshots] [--tabs chat]

--small uses the 0.5B draft file as both target and draft (fast, for a busy machine).
"""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from app.serve.access import Access
from app.serve.server import launch
from app.ui import build_app, page_mounter
from app.runtime.holder import PairHolder
from engine.backend import ModelConfig
from engine.generation_config import GenerationConfig
from loading.chats import ChatStore

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CHAT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
COMPARE_PROMPT = "Write a Python function that checks whether a string is a palindrome."
# The chat tab's shot: two earlier chats in the sidebar, then two turns of the one shown.
EARLIER_CHATS = ("How do I read a CSV file in Python?", "Explain list comprehensions.")
CHAT_TURNS = (CHAT_PROMPT, "Now make it iterative.")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_number(page, accordion: str, elem_id: str, value: int) -> None:
    """Open a settings accordion, set a slider and close the accordion again. A busy page can
    drop the first input event, so the value is set again until the slider shows it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(f"#{accordion} button.label-wrap").click()
    slider = page.locator(f"#{elem_id} input[type=range]")
    for _ in range(5):
        slider.fill(str(value))
        try:
            page.wait_for_function(f"document.querySelector('#{elem_id} input[type=number]').value == '{value}'",
                                   timeout=5_000)
            break
        except PlaywrightTimeout:
            continue
    else:
        raise RuntimeError(f"could not set {elem_id} to {value}")
    page.locator(f"#{accordion} button.label-wrap").click()


def choose(page, accordion: str, elem_id: str, value: str) -> None:
    """Pick a value in a settings dropdown."""
    page.locator(f"#{accordion} button.label-wrap").click()
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=value, exact=True).click()
    page.wait_for_function(f"document.querySelector('#{elem_id} input').value == '{value}'")
    page.locator(f"#{accordion} button.label-wrap").click()


def shoot_chat(page, out: Path, max_tokens: int, policy: str) -> Path:
    """Two short chats kept in the sidebar, then a chat with a system prompt preset over two
    turns (the second one's prompt comes from the cache: the panel shows it)."""
    set_number(page, "chat-settings", "chat-max-tokens", max_tokens)
    choose(page, "chat-settings", "chat-policy", policy)
    for text in (*EARLIER_CHATS, None):
        page.locator("#chat-new").click()
        if text is None:
            break
        say(page, text)
    page.locator("#chat-preset input").click()
    page.get_by_role("option", name="concise coder", exact=True).click()
    for text in CHAT_TURNS:
        say(page, text)
    path = out / "chat.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def say(page, text: str) -> None:
    page.evaluate("document.querySelector('#chat-metrics .tandem-metrics').dataset.old = '1'")
    page.locator("#chat-input textarea").fill(text)
    page.locator("#chat-send").click()
    page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]:not([data-old])',
                           timeout=600_000)


def shoot_compare(page, out: Path, max_tokens: int, policy: str) -> Path:
    page.get_by_role("tab", name="Side by side").click()
    set_number(page, "compare-settings", "compare-max-tokens", max_tokens)
    choose(page, "compare-settings", "compare-policy", policy)
    page.locator("#compare-prompt textarea").fill(COMPARE_PROMPT)
    page.locator("#compare-run").click()
    page.wait_for_selector("#compare-summary :text('speedup')", timeout=600_000)
    page.wait_for_selector('#compare-spec .tandem-metrics[data-state="done"]', timeout=600_000)
    path = out / "compare.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def shoot_models(page, out: Path, max_tokens: int, policy: str) -> Path:
    page.get_by_role("tab", name="Models").click()
    page.locator("#wizard-pair input").click()
    page.get_by_role("option").first.click()
    page.locator("#wizard-check").click()
    page.wait_for_selector("#wizard-report .tandem-check", timeout=60_000)
    path = out / "models.png"
    page.screenshot(path=str(path), full_page=True)
    return path


SHOTS = {"chat": shoot_chat, "compare": shoot_compare, "models": shoot_models}


def shoot(url: str, out: Path, max_tokens: int, chromium: str, policy: str = "fixed",
          tabs: tuple[str, ...] = tuple(SHOTS)) -> list[Path]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.goto(url)
            page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=300_000)
            return [SHOTS[tab](page, out, max_tokens, policy) for tab in tabs]
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--small", action="store_true", help="the 0.5B draft as both target and draft")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--policy", default="fixed", help="gamma policy for both runs (fixed, heuristic, adaptive)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    ap.add_argument("--tabs", default=",".join(SHOTS), help="which tabs to shoot (chat,compare,models)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"error: chromium not found at {args.chromium} (apt-get install chromium)", file=sys.stderr)
        return 2

    from models import embedded
    target, draft = (args.target, args.draft)
    if target is None or draft is None:
        t, d = embedded.ensure()
        target, draft = target or str(d if args.small else t), draft or str(d)
    holder = PairHolder()
    error = holder.load(ModelConfig(target, n_ctx=args.ctx), ModelConfig(draft, n_ctx=args.ctx))
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # The first decode pages the weights in from disk; warm both models so the shots show steady state.
    for drafter in ("plain", "draft"):
        for _ in holder.pair.generate("hi", GenerationConfig(max_tokens=4), drafter=drafter):
            pass
    args.out.mkdir(parents=True, exist_ok=True)
    # The shots' chats go to a folder of their own, not the user's store.
    chats = ChatStore(Path(tempfile.mkdtemp(prefix="tandem-screenshot-chats-")))
    running = launch(page_mounter(build_app(holder, chats=chats)), Access("127.0.0.1", free_port()))
    tabs = tuple(t for t in args.tabs.split(",") if t)
    try:
        for path in shoot(running.url, args.out, args.max_tokens, args.chromium, args.policy, tabs):
            print(f"saved {path}")
    finally:
        running.close()
        holder.close()
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    sys.exit(main())
