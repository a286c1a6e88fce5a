"""The docs are references: docs/BENCHMARKS.md holds at most 150 lines of current tables, every
relative link in the Markdown docs resolves, and docs/results/latest/ holds only what a doc links.
A result counts as linked when a doc links it, a folder of it, or another file of its own folder:
a `scripts/benchmarks` step rewrites its folder whole (report, tables, plots), so the folder stays
when one of its files is cited, and a folder no doc cites is stale."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "latest"
BENCHMARKS_LIMIT = 150
# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
LINK = re.compile(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, CHANGELOG.md and the Markdown under docs/ but the benchmark output."""
    docs = [root / "README.md", root / "CHANGELOG.md"]
    docs += [p for p in sorted((root / "docs").rglob("*.md"))
             if not p.is_relative_to(root / "docs" / "results")]
    return [p for p in docs if p.is_file()]


def local_links(doc: Path) -> list[tuple[str, Path]]:
    """The relative links of a Markdown file, each with the path it names (anchors dropped)."""
    out = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, a mailto: or an anchor in the same page
        path = target.split("#", 1)[0]
        out.append((target, (doc.parent / path).resolve()))
    return out


def broken_links(docs: list[Path]) -> list[str]:
    return [f"{doc.name}: {target}" for doc in docs for target, path in local_links(doc)
            if not path.exists()]


def unlinked_results(docs: list[Path], results: Path) -> list[str]:
    """Files under results that no doc links: neither the file, nor a folder of it below results,
    nor another file of its folder (the top folder's own files must be linked one by one)."""
    linked = {path for doc in docs for _, path in local_links(doc)}
    root = results.resolve()
    cited_folders = {p.parent for p in linked if p.is_file() and p.parent != root}
    out = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        folders = [d for d in f.parents if d.is_relative_to(root) and d != root]
        if f in linked or linked.intersection(folders) or f.parent in cited_folders:
            continue
        out.append(str(f.relative_to(root)))
    return out


def page_lines(page: Path) -> int:
    return len(page.read_text(encoding="utf-8").splitlines())


def test_benchmarks_is_a_short_reference():
    n = page_lines(ROOT / "docs" / "BENCHMARKS.md")
    assert n <= BENCHMARKS_LIMIT, f"docs/BENCHMARKS.md has {n} lines"


def test_every_link_in_the_docs_resolves():
    docs = doc_files()
    assert ROOT / "docs" / "BENCHMARKS.md" in docs
    assert broken_links(docs) == []


def test_results_hold_only_what_the_docs_link():
    assert unlinked_results(doc_files(), RESULTS) == []


def test_the_checks_catch_a_broken_link_a_long_page_and_a_stale_result(tmp_path):
    latest = tmp_path / "docs" / "results" / "latest"
    for name in ("run/report.md", "run/plot.png", "stale/report.md", "old.md"):
        (latest / name).parent.mkdir(parents=True, exist_ok=True)
        (latest / name).write_text("x\n")
    (tmp_path / "README.md").write_text("[ok](docs/results/latest/run/report.md) "
                                        "[web](https://example.com) [anchor](#top)\n")
    page = tmp_path / "docs" / "BENCHMARKS.md"
    page.write_text("[gone](results/latest/missing.md)\n" + "row\n" * BENCHMARKS_LIMIT)
    docs = doc_files(tmp_path)
    assert broken_links(docs) == ["BENCHMARKS.md: results/latest/missing.md"]
    assert unlinked_results(docs, latest) == ["old.md", "stale/report.md"]
    assert page_lines(page) > BENCHMARKS_LIMIT
    page.write_text("[stale](results/latest/stale/) [old](results/latest/old.md)\n")
    docs = doc_files(tmp_path)
    assert broken_links(docs) == []
    assert unlinked_results(docs, latest) == []
