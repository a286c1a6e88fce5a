"""The shipped prompt suite and the suite loader's errors."""
from __future__ import annotations

import json

import pytest

from engine.tools.benchmark.suite import DEFAULT_SUITE, load_suite
from engine.errors import SettingsError

REQUIRED = {"code-generation", "code-editing", "chat", "math", "summarization", "translation"}


def test_shipped_suite_has_six_categories_of_eight_prompts_with_unique_ids():
    suite = load_suite()
    assert suite.version == 1 and DEFAULT_SUITE.name == "suite-v1.jsonl"
    assert REQUIRED <= set(suite.categories)
    for cat in suite.categories:
        assert len([p for p in suite.prompts if p.category == cat]) >= 8
    assert len({p.id for p in suite.prompts}) == len(suite.prompts)


def test_code_editing_prompts_carry_the_code_the_answer_copies():
    edits = load_suite().select(["code-editing"]).prompts
    assert all("\n" in p.prompt and len(p.prompt) > 100 for p in edits)


def test_select_keeps_file_order_and_caps_per_category():
    suite = load_suite()
    chosen = suite.select(["math", "chat"], per_category=2)
    assert [p.category for p in chosen.prompts] == ["math", "math", "chat", "chat"]
    assert chosen.prompts[0] == suite.select(["math"]).prompts[0]


@pytest.mark.parametrize("cats, per, msg", [(["poetry"], None, "unknown category poetry"),
                                            (["math"], 0, "prompts per category must be >= 1")])
def test_select_rejects_bad_choices(cats, per, msg):
    with pytest.raises(SettingsError, match=msg):
        load_suite().select(cats, per)


def _write(tmp_path, lines):
    p = tmp_path / "s.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("lines, msg", [
    ([], "is empty"),
    (['{"id": "a", "category": "c", "prompt": "p"}'], "first line must name the suite"),
    (['{"suite": "s", "version": 1}', "{oops"], r"s.jsonl:2: not JSON"),
    (['{"suite": "s", "version": 1}', '{"id": "a", "category": "c"}'], "needs non-empty id"),
    (['{"suite": "s", "version": 1}', '{"id": "a", "category": "c", "prompt": "p"}',
      '{"id": "a", "category": "c", "prompt": "q"}'], "duplicate prompt id 'a'"),
    (['{"suite": "s", "version": 1}'], "has no prompts"),
])
def test_bad_suite_files_give_one_line_errors(tmp_path, lines, msg):
    with pytest.raises(SettingsError, match=msg):
        load_suite(_write(tmp_path, lines))


def test_missing_suite_file(tmp_path):
    with pytest.raises(SettingsError, match="cannot read the prompt suite"):
        load_suite(tmp_path / "nope.jsonl")


def test_custom_suite_round_trip(tmp_path):
    rows = [{"suite": "mine", "version": 3}, {"id": "x1", "category": "k", "prompt": "hello"}]
    suite = load_suite(_write(tmp_path, [json.dumps(r) for r in rows]))
    assert (suite.name, suite.version, suite.prompts[0].prompt) == ("mine", 3, "hello")
