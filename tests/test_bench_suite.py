"""The shipped prompt suite and the suite loader's errors."""
from __future__ import annotations

import json

import pytest

from engine.errors import SettingsError
from engine.grammar.llg import compile_grammar
from engine.grammar.spec import JSON_SCHEMA
from bench.fakes.spelled import SpelledBackend, byte_spelling
from bench.overhead.banks import llm_like_bank
from bench.benchmark.suite import DEFAULT_SUITE, load_suite

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


STRUCTURED = DEFAULT_SUITE.parent / "structured-v1.jsonl"


def test_the_structured_workload_carries_a_schema_on_every_prompt_and_each_compiles():
    suite = load_suite(STRUCTURED)
    assert suite.categories == ["tool-call", "tool-choice", "extraction"]
    assert len(suite.prompts) >= 16 and len({p.id for p in suite.prompts}) == len(suite.prompts)
    # Token i is byte i, and the backend writes text with those tokens: llguidance can force
    # canonical tokenizations through it.
    backend = SpelledBackend(llm_like_bank(300, seed=0, slots=2), "bytes", byte_spelling(300))
    for p in suite.prompts:
        assert p.grammar is not None and p.grammar.kind == JSON_SCHEMA
        schema = json.loads(p.grammar.source)
        compile_grammar(p.grammar, backend)
        if p.category == "extraction":
            # The record is extracted from a paragraph in the prompt, the schema shown with it.
            assert "Text:\n" in p.prompt and json.dumps(schema) in p.prompt
        else:
            # A call object {"name": const, "arguments": {...}}, or one of several; the tools
            # are described in the prompt.
            calls = schema["anyOf"] if p.category == "tool-choice" else [schema]
            assert len(calls) >= (2 if p.category == "tool-choice" else 1)
            for call in calls:
                assert call["required"] == ["name", "arguments"]
                assert call["properties"]["name"]["const"] + "(" in p.prompt


def test_a_prompt_without_a_schema_runs_free_and_a_bad_schema_names_its_line(tmp_path):
    free = load_suite(_write(tmp_path, ['{"suite": "s", "version": 1}',
                                        '{"id": "a", "category": "c", "prompt": "p"}']))
    assert free.prompts[0].grammar is None
    with pytest.raises(SettingsError, match=r"s.jsonl:3: a JSON schema must be an object"):
        load_suite(_write(tmp_path, ['{"suite": "s", "version": 1}',
                                     '{"id": "a", "category": "c", "prompt": "p", "schema": {}}',
                                     '{"id": "b", "category": "c", "prompt": "p", "schema": 3}']))
