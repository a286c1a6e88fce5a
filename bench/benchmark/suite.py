"""The versioned prompt suite: a JSON-lines file whose first line names the suite and its
version, and whose other lines are prompts with an id, a category and the prompt text, and
optionally `schema`: the JSON schema the answer must follow (assets/prompts/structured-v1.jsonl),
run as the constraint of every run of that prompt, speculative and plain alike."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from engine.errors import GrammarError, SettingsError
from engine.grammar.spec import GrammarSpec

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "suite-v1.jsonl"
# Whole-file edits: the workload copies pay on (the side-by-side tab offers the first as an example).
FILE_EDITS = DEFAULT_SUITE.with_name("file-edits-v1.jsonl")


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    prompt: str
    # The constraint every run of this prompt decodes under; None: free text.
    grammar: GrammarSpec | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    prompts: tuple[SuitePrompt, ...]

    @property
    def categories(self) -> list[str]:
        """Categories in the order they first appear in the file."""
        return list(dict.fromkeys(p.category for p in self.prompts))

    def select(self, categories: Sequence[str] | None = None,
               per_category: int | None = None) -> "Suite":
        """The prompts of some categories, at most `per_category` of each (file order)."""
        if not categories and per_category is None:
            # Every prompt in file order: a workload whose requests build on earlier ones
            # (assets/prompts/history-v1.jsonl) runs as written.
            return self
        known = self.categories
        wanted = list(categories) if categories else known
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise SettingsError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} "
                                f"{', '.join(unknown)}; the suite has: {', '.join(known)}")
        if per_category is not None and per_category < 1:
            raise SettingsError(f"prompts per category must be >= 1, got {per_category}")
        chosen: list[SuitePrompt] = []
        for cat in wanted:
            of_cat = [p for p in self.prompts if p.category == cat]
            chosen.extend(of_cat[:per_category] if per_category else of_cat)
        return Suite(self.name, self.version, tuple(chosen))


def load_suite(path: str | Path = DEFAULT_SUITE) -> Suite:
    path = Path(path)
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as e:
        raise SettingsError(f"cannot read the prompt suite {path}: {e.strerror or e}") from None
    if not lines:
        raise SettingsError(f"the prompt suite {path} is empty")
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SettingsError(f"{path}:{n}: not JSON ({e.msg})") from None
    header = rows[0]
    if not isinstance(header, dict) or "version" not in header or "prompt" in header:
        raise SettingsError(f"{path}:1: the first line must name the suite and its version")
    prompts: list[SuitePrompt] = []
    seen: set[str] = set()
    for n, row in enumerate(rows[1:], 2):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row.get(k)
                                                for k in ("id", "category", "prompt")):
            raise SettingsError(f"{path}:{n}: a prompt needs non-empty id, category and prompt")
        if row["id"] in seen:
            raise SettingsError(f"{path}:{n}: duplicate prompt id {row['id']!r}")
        seen.add(row["id"])
        prompts.append(SuitePrompt(row["id"], row["category"], row["prompt"],
                                   _grammar(row, f"{path}:{n}")))
    if not prompts:
        raise SettingsError(f"the prompt suite {path} has no prompts")
    return Suite(str(header.get("suite", path.stem)), int(header["version"]), tuple(prompts))


def _grammar(row: dict, where: str) -> GrammarSpec | None:
    """A prompt's `schema`, as the constraint of its runs."""
    if "schema" not in row:
        return None
    try:
        return GrammarSpec.schema(row["schema"])
    except GrammarError as e:
        raise SettingsError(f"{where}: {e}") from None
