"""The side-by-side tab's examples: fresh code and a whole-file edit from the shipped suite."""
from __future__ import annotations

from app.ui import compare
from bench.benchmark.suite import FILE_EDITS, load_suite


def test_the_examples_offer_fresh_code_and_the_suites_first_whole_file_edit():
    fresh, edit = compare.example_prompts()
    assert fresh == compare.FRESH_PROMPT
    first = load_suite(FILE_EDITS).prompts[0]
    assert first.category == "file-editing" and edit == first.prompt
    # The edit quotes the file it asks back: the copy the speculative side drafts from.
    assert edit.count("```") >= 2 and len(edit.splitlines()) > 20
