"""Structured output through `tandem generate` (--json-schema, --grammar, --logprobs) and the
page (the structured-output setting), over a byte-level fake whose tokenizer spells text with
its own tokens (tests/byte_fake.py): bad files and schemas are one-line errors before any
decoding, a schema's answer is JSON that follows it, and forced tokens are coloured and counted."""
from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr
import pytest

from app import cli
from app.runtime import open_pair
from app.runtime.holder import PairHolder
from app.runtime.structured import OBJECT, OFF, SCHEMA
from app.ui import compare, controls, metrics
from app.ui.chat import respond
from app.ui.state import StopFlags
from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.events import FORCED
from engine.pair import Pair
from tests.byte_fake import ByteFake

SCHEMA_DOC = {"type": "object",
              "properties": {"ok": {"type": "boolean"}, "name": {"enum": ["alpha", "beta"]}},
              "required": ["ok", "name"], "additionalProperties": False}
# A schema llguidance refuses, and its message.
REFUSED = '{"type": "object", "properties": {"a": {"type": "frob"}}}'
REFUSED_MESSAGE = "the JSON schema is not valid: Invalid type: frob"
# drafter, policy, gamma, temperature, top-k, top-p, min-p, seed, max tokens
PAGE = ("draft", "fixed", 2, 0.0, 0, 1.0, 0.0, -1, 64)


def byte_pair() -> Pair:
    return Pair(ByteFake(seed=1), ByteFake(seed=1, noise=0.5))


def follows_schema(text: str) -> bool:
    doc = json.loads(text)
    return (set(doc) == {"ok", "name"} and isinstance(doc["ok"], bool)
            and doc["name"] in ("alpha", "beta"))


@pytest.fixture
def tandem(monkeypatch, capsys, tmp_path):
    """`tandem generate` in this process over a fake pair; returns (exit code, stdout, stderr,
    whether a model was loaded)."""
    loaded: list[Pair] = []

    def load(*args, **kwargs) -> Pair:
        loaded.append(byte_pair())
        return loaded[-1]

    monkeypatch.setattr(cli, "model_configs", lambda args, chosen=None: (ModelConfig("t.gguf"), None))
    monkeypatch.setattr(open_pair, "plan_load", lambda *args: SimpleNamespace(offload=None, draft=None, target=SimpleNamespace(path="t.gguf", lora=())))
    # The load is faked whole: no files to key, no calibrations to keep.
    monkeypatch.setattr(open_pair, "key_for", lambda *args: None)
    monkeypatch.setattr(open_pair, "keep_calibrations", lambda *args, **kwargs: None)
    monkeypatch.setattr(open_pair, "execute", load)

    def run(*argv: str) -> tuple[int, str, str, bool]:
        loaded.clear()
        code = cli.main(["generate", "--prompt", "hi", "--raw", "--no-history", "--max-tokens",
                         "64", *argv])
        out, err = capsys.readouterr()
        return code, out, err, bool(loaded)

    return run


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("drafter", [["--drafter", "plain"],
                                     ["--drafter", "draft", "--policy", "fixed", "--gamma", "2"]])
def test_a_schema_file_makes_json_that_follows_it(tandem, tmp_path, drafter):
    path = write(tmp_path, "answer.json", json.dumps(SCHEMA_DOC, indent=2))
    code, out, err, _ = tandem("--json-schema", path, *drafter)
    assert code == 0, err
    assert follows_schema(out), out
    code, out, _, _ = tandem("--json-schema", path, "--json", *drafter)
    result = json.loads(out)
    assert follows_schema(result["text"]) and result["logprobs"] is None
    # Keys, quotes and colons are the only tokens the schema allows: committed without a model.
    assert result["stats"]["forced_tokens"] > 0 or drafter[1] == "plain"


def test_a_gbnf_grammar_file_and_a_lark_one(tandem, tmp_path):
    gbnf = write(tmp_path, "yesno.gbnf", 'root ::= "yes" | "no"\n')
    code, out, err, _ = tandem("--grammar", gbnf, "--drafter", "plain")
    assert code == 0 and out in ("yes", "no"), err
    lark = write(tmp_path, "digits.lark", 'start: /[0-9]{3}/\n')
    code, out, err, _ = tandem("--grammar", lark, "--drafter", "plain")
    assert code == 0 and len(out) == 3 and out.isdigit(), err


@pytest.mark.parametrize("option, name, text, message, loads", [
    ("--json-schema", None, "", "error: --json-schema: file not found: ", False),
    ("--grammar", None, "", "error: --grammar: file not found: ", False),
    ("--json-schema", "s.json", '{"type": ', "error: the JSON schema is not valid JSON: ", False),
    ("--json-schema", "s.json", "[1, 2]", "error: a JSON schema must be an object", False),
    ("--grammar", "g.lark", "  \n", "error: the lark grammar is empty", False),
    ("--json-schema", "s.json", REFUSED, "error: " + REFUSED_MESSAGE, True),
    ("--grammar", "g.lark", "start: foo\n",
     'error: the lark grammar is not valid: at 1(8): unknown name: "foo"', True),
    ("--grammar", "g.gbnf", 'root ::= "a" (\n', "error: the GBNF grammar is not valid", True),
])
def test_a_bad_file_is_one_line_before_any_decoding(tandem, tmp_path, option, name, text,
                                                    message, loads):
    path = write(tmp_path, name, text) if name else str(tmp_path / "missing.json")
    code, out, err, loaded = tandem(option, path)
    assert code == 2 and out == ""
    assert error_line(err).startswith(message)
    # What the file's text alone refuses is refused before a model loads; what only the
    # constraint engine can judge, right after loading, before a token is decoded.
    assert loaded == loads


def test_a_folder_is_not_a_schema_file(tandem, tmp_path):
    code, _, err, loaded = tandem("--json-schema", str(tmp_path))
    assert code == 2 and not loaded and "is a folder" in error_line(err)


def test_schema_and_grammar_are_one_or_the_other(tandem, tmp_path, capsys):
    path = write(tmp_path, "s.json", json.dumps(SCHEMA_DOC))
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "--prompt", "hi", "--json-schema", path, "--grammar", path])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_logprobs_are_printed_only_when_asked(tandem, tmp_path):
    path = write(tmp_path, "answer.json", json.dumps(SCHEMA_DOC))
    code, out, err, _ = tandem("--json-schema", path, "--drafter", "plain")
    assert code == 0 and "log probabilities" not in out + err
    code, out, err, _ = tandem("--json-schema", path, "--drafter", "plain", "--logprobs", "2")
    # stdout stays the answer; the table is on stderr, one line per token after its header.
    assert code == 0 and follows_schema(out)
    table = err.split("log probabilities (the target's own, at temperature 1):\n")[1].splitlines()
    assert table[0].split() == ["#", "token", "logprob", "most", "likely"]
    assert table[1].split()[:2] == ["0", '"{"'] and len(table[1].split()) == 7
    code, out, _, _ = tandem("--json-schema", path, "--drafter", "plain", "--logprobs", "2", "--json")
    result = json.loads(out)
    rows = result["logprobs"]
    assert "".join(r["token"] for r in rows) == result["text"]
    assert len(rows) == result["stats"]["output_tokens"]
    assert all(len(r["top"]) == 2 and r["logprob"] <= 0 and r["top"][0]["logprob"] >= r["top"][1]["logprob"]
               for r in rows)


def test_logprobs_take_the_tables_range(tandem):
    code, _, err, loaded = tandem("--logprobs", "21")
    assert code == 2 and not loaded
    assert error_line(err) == ("error: top_logprobs must be between 0 and 20 (each token's log "
                               "probability with this many alternatives; absent is none), got 21")


def page_spec(output: str, schema: str = ""):
    return controls.spec(PairHolder(byte_pair()).offer(), *PAGE, history=False, output=output,
                         schema=schema)


def test_the_page_setting_makes_the_grammar():
    assert page_spec(OFF).grammar is None and page_spec(OFF, "not even JSON").grammar is None
    assert page_spec(OBJECT).grammar.kind == "json_object"
    spec = page_spec(SCHEMA, json.dumps(SCHEMA_DOC, indent=4))
    assert json.loads(spec.grammar.source) == SCHEMA_DOC
    with pytest.raises(SettingsError, match="paste a JSON schema"):
        page_spec(SCHEMA, "  ")
    with pytest.raises(SettingsError, match="the JSON schema is not valid JSON"):
        page_spec(SCHEMA, "{")
    with pytest.raises(SettingsError, match="structured output must be one of"):
        page_spec("XML")


def test_the_chat_answers_in_the_schema_with_forced_tokens_coloured_and_counted():
    holder = PairHolder(byte_pair())
    spec = page_spec(SCHEMA, json.dumps(SCHEMA_DOC))
    *_, (history, tokens, panel, stats, box, _) = respond(holder, StopFlags(), "s", "hi", [], spec)
    assert follows_schema(stats["text"]) and history[-1]["content"] == stats["text"]
    assert stats["forced_tokens"] > 0 and box == gr.update()
    assert f'class="tok-{FORCED}"' in tokens and metrics.ORIGIN_COLORS[FORCED] in tokens
    assert f"{stats['forced_tokens']} {FORCED}" in tokens
    share = round(100 * stats["forced_tokens"] / stats["output_tokens"])
    assert f"{stats['forced_tokens']} ({share}%)" in panel


def test_a_schema_the_engine_refuses_is_a_page_error_and_nothing_is_lost():
    holder = PairHolder(byte_pair())
    stream = respond(holder, StopFlags(), "s", "keep me", [], page_spec(SCHEMA, REFUSED))
    with pytest.raises(gr.Error, match=REFUSED_MESSAGE):
        # The error comes before the first update: the message stays in its box.
        next(stream)
    assert holder.queue.snapshot()["running"] == 0
    with pytest.raises(gr.Error, match=REFUSED_MESSAGE):
        next(compare.compare(holder, StopFlags(), "s", "hi", page_spec(SCHEMA, REFUSED), 1))


def test_side_by_side_constrains_both_runs():
    holder = PairHolder(byte_pair())
    spec = page_spec(SCHEMA, json.dumps(SCHEMA_DOC))
    *_, (left, right, _, results) = compare.compare(holder, StopFlags(), "s", "hi", spec, 1)
    (plain,), (speculative,) = results["plain"], results["speculative"]
    assert follows_schema(plain["text"]) and follows_schema(speculative["text"])
    assert results["identical"] is True
    assert "tok-forced" in right and speculative["forced_tokens"] > 0


def test_the_panel_shows_no_forced_card_without_forced_tokens():
    from engine.stats import GenerationStats
    out = metrics.live_panel(GenerationStats(mode="plain", output_tokens=3, rounds=3))
    assert "forced" not in out
