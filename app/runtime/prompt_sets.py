"""The prompts a command measures or trains on: a prompts file (a suite JSONL, or plain text with
one prompt per line), else the built-in suite, either narrowed to some categories. `tandem tune`
and `tandem adapt` (and the Models tab's adapt action) read them here."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from bench.benchmark.suite import DEFAULT_SUITE, SuitePrompt, load_suite
from engine.errors import SettingsError


def interleave(prompts: list[SuitePrompt]) -> list[SuitePrompt]:
    """First prompt of each category, then the second of each, ...: a budget that cuts the list
    short still covers every category."""
    by_cat: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    rows = list(by_cat.values())
    return [r[i] for i in range(max(map(len, rows), default=0)) for r in rows if i < len(r)]


def read_prompts(path: str | None, category: Sequence[str] | None) -> list[SuitePrompt]:
    """`path`'s prompts (category "prompts" for a plain-text file), else the suite's; `category`:
    comma-separated category names, from a suite only."""
    categories = [c.strip() for group in category or [] for c in group.split(",") if c.strip()]
    if path:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"cannot read the prompts file {file}: {exc.strerror or exc}") from None
        if file.suffix == ".jsonl":
            return interleave(list(load_suite(file).select(categories or None).prompts))
        if categories:
            raise SettingsError("--category selects from a suite; a plain-text prompts file has none")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise SettingsError(f"the prompts file {file} has no prompts")
        return [SuitePrompt(f"line-{i + 1}", "prompts", ln) for i, ln in enumerate(lines)]
    return interleave(list(load_suite(DEFAULT_SUITE).select(categories or None).prompts))
