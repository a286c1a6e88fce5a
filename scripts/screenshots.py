"""Save one screenshot per tab of the app into docs/screenshots/ (chat, side by side, models).

Launches the app on a free local port with the embedded pair (or --target/--draft), drives
Debian's Chromium through Playwright with a short chat, one side-by-side run and a catalog check
in the wizard, and writes chat.png, compare.png and models.png.

    .venv/bin/python -m scripts.screenshots [--small] [--max-tokens 48] [--policy fixed] [--out docs/screenshots]

--small uses the 0.5B draft file as both target and draft (fast, for a busy machine).
"""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import argparse
import shutil
import sys
from pathlib import Path

from app.serve.access import Access
from app.serve.server import launch
from app.ui import build_app, page_mounter
from app.runtime.holder import PairHolder
from engine.backend import ModelConfig
from engine.generation_config import GenerationConfig

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CHAT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
COMPARE_PROMPT = "Write a Python function that checks whether a string is a palindrome."


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


def shoot(url: str, out: Path, max_tokens: int, chromium: str, policy: str = "fixed") -> list[Path]:
    from playwright.sync_api import sync_playwright

    saved = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.goto(url)
            page.wait_for_selector('#tandem-status[data-state="ready"]', timeout=300_000)

            set_number(page, "chat-settings", "chat-max-tokens", max_tokens)
            choose(page, "chat-settings", "chat-policy", policy)
            page.locator("#chat-input textarea").fill(CHAT_PROMPT)
            page.locator("#chat-send").click()
            page.wait_for_selector('#chat-metrics .tandem-metrics[data-state="done"]', timeout=600_000)
            saved.append(out / "chat.png")
            page.screenshot(path=str(saved[-1]), full_page=True)

            page.get_by_role("tab", name="Side by side").click()
            set_number(page, "compare-settings", "compare-max-tokens", max_tokens)
            choose(page, "compare-settings", "compare-policy", policy)
            page.locator("#compare-prompt textarea").fill(COMPARE_PROMPT)
            page.locator("#compare-run").click()
            page.wait_for_selector("#compare-summary :text('speedup')", timeout=600_000)
            page.wait_for_selector('#compare-spec .tandem-metrics[data-state="done"]', timeout=600_000)
            saved.append(out / "compare.png")
            page.screenshot(path=str(saved[-1]), full_page=True)

            page.get_by_role("tab", name="Models").click()
            page.locator("#wizard-pair input").click()
            page.get_by_role("option").first.click()
            page.locator("#wizard-check").click()
            page.wait_for_selector("#wizard-report .tandem-check", timeout=60_000)
            saved.append(out / "models.png")
            page.screenshot(path=str(saved[-1]), full_page=True)
        finally:
            browser.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--small", action="store_true", help="the 0.5B draft as both target and draft")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--policy", default="fixed", help="gamma policy for both runs (fixed, heuristic, adaptive)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
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
    running = launch(page_mounter(build_app(holder)), Access("127.0.0.1", free_port()))
    try:
        for path in shoot(running.url, args.out, args.max_tokens, args.chromium, args.policy):
            print(f"saved {path}")
    finally:
        running.close()
        holder.close()
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    sys.exit(main())
