"""The same settings through the three front ends (the CLI's argument parser, the page's control
values, the API's request body) make the same RunSpec, or the same one-line error message
(app/runtime/request.py, app/runtime/ranges.py)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Sequence

import gradio as gr
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import build_parser
from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_POLICY, PLAIN, POLICIES
from app.runtime.ranges import BY_NAME
from app.runtime.request import Offer, RunSpec, resolve
from app.runtime.structured import SCHEMA
from app.serve.errors import BadRequestError
from app.serve.parsing import parse_completion
from app.runtime.structured import file_spec
from app.settings import request_settings
from app.ui import controls
from engine.errors import SettingsError
from engine.grammar.spec import GrammarSpec

OFFER = Offer(("plain", "draft", "hybrid", "lookup", "suffix"), "hybrid", n_ctx=4096)
with gr.Blocks():
    # The page's controls as it builds them: a value the user leaves alone is the widget's.
    WIDGETS = dict(zip(controls.WIDGETS, (w.value for w in controls.build(
        list(OFFER.drafters), OFFER.drafter, "agree"))))


def numbers(low: float, high: float) -> st.SearchStrategy:
    return st.one_of(st.floats(low, high, allow_nan=False), st.integers(int(low) - 1, int(high) + 1),
                     st.sampled_from([float("inf"), float("nan")]))


def integers(low: int, high: int) -> st.SearchStrategy:
    # Integral floats are integers; 2.5 is not.
    return st.one_of(st.integers(low, high), st.sampled_from([2.5, 4.0, -1.0]))


SETTINGS = {
    "drafter": st.sampled_from(["draft", "plain", "lookup", "hybrid", "none", "oracle"]),
    "policy": st.sampled_from([*POLICIES, "greedy"]),
    "gamma": integers(-2, 40),
    "temperature": numbers(-1.0, 3.0),
    "top_k": integers(-3, 300),
    "top_p": numbers(-0.5, 1.5),
    "min_p": numbers(-0.5, 1.5),
    "seed": integers(-3, 2**40),
    "max_tokens": integers(-2, 5000),
    "stop": st.lists(st.text("ab\n", max_size=3), max_size=2),
    "history": st.booleans(),
    "prediction": st.text("ab\n é", max_size=6),
}
# The CLI reads a prediction from a file, the page from its box, the API from OpenAI's object.
PREDICTION_DIR = Path(tempfile.mkdtemp(prefix="tandem-agree-"))
CHOSEN = st.fixed_dictionaries({}, optional=SETTINGS)


def text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def through_cli(chosen: dict, extra: Sequence[str] = ()) -> RunSpec | str:
    argv = ["generate", "--prompt", "x", "--raw", "--target", "t.gguf", "--draft", "d.gguf", *extra]
    for name, value in chosen.items():
        if name == "stop":
            argv += [f"--stop={s}" for s in value]
        elif name == "history":
            argv += [] if value else ["--no-history"]
        elif name == "prediction":
            path = PREDICTION_DIR / f"{abs(hash(value))}.txt"
            path.write_text(value, encoding="utf-8", newline="")
            argv.append(f"--prediction={path}")
        else:
            argv.append(f"{BY_NAME[name].cli_option}={text(value)}")
    args = build_parser().parse_args(argv)
    try:
        # The command's translation, resolved against the same pair as the others.
        return resolve(request_settings(args), OFFER, prompt=args.prompt, raw=args.raw,
                       grammar=file_spec(args.json_schema, args.grammar))
    except SettingsError as exc:
        return str(exc)


def through_api(chosen: dict) -> RunSpec | str:
    body: dict = {"prompt": "x"}
    speculative = {k: v for k, v in chosen.items() if k in ("drafter", "policy", "gamma", "history")}
    body.update({k: v for k, v in chosen.items() if k not in speculative})
    if "prediction" in chosen:
        body["prediction"] = {"type": "content", "content": chosen["prediction"]}
    if speculative:
        body["speculative"] = speculative
    try:
        return parse_completion(body, OFFER).spec
    except BadRequestError as exc:
        assert exc.status == 400 and exc.param
        return str(exc)


def through_page(chosen: dict, **output: str) -> RunSpec | str:
    values = {**WIDGETS, **{k: v for k, v in chosen.items() if k in WIDGETS}}
    if "gamma" not in chosen:
        # The gamma slider follows the policy dropdown to that policy's default.
        values["gamma"] = DEFAULT_GAMMA.get(values["policy"], DEFAULT_GAMMA[DEFAULT_POLICY])
    try:
        return controls.spec(OFFER, **values, history=chosen.get("history", True),
                             prompt="x", raw=True, prediction=chosen.get("prediction", ""),
                             **output)
    except SettingsError as exc:
        return str(exc)


def page_can_say(chosen: dict) -> bool:
    """The page has no stop strings, and with drafter plain it gives no policy or gamma."""
    plain = chosen.get("drafter") in (PLAIN, "none")
    return "stop" not in chosen and not (plain and ({"policy", "gamma"} & chosen.keys()))


# Derandomized like the sweep: every run tries the same 400 cases.
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(CHOSEN)
def test_the_three_front_ends_agree(chosen):
    cli, api = through_cli(chosen), through_api(chosen)
    assert cli == api
    if page_can_say(chosen):
        assert through_page(chosen) == cli
    if isinstance(cli, str):
        assert "\n" not in cli and cli.split()[0] in SETTINGS


@pytest.mark.parametrize("chosen, outcome", [
    ({"gamma": 0, "drafter": "draft"}, (PLAIN, None, 0)),
    ({"seed": -1}, -1),
    ({"temperature": -0.5}, "temperature must be >= 0 (0 is greedy), got -0.5"),
    ({"top_k": 2.5}, "top_k must be an integer, got 2.5"),
    ({"max_tokens": 4097}, "max_tokens must be between 1 and 4096 (the answer's length; at most "
                           "what the context holds), got 4097"),
    ({"drafter": "plain", "gamma": 4}, "gamma has no effect with drafter plain (plain decoding); "
                                       "drop it"),
])
def test_named_cases_agree_and_read_as_documented(chosen, outcome):
    """Named examples of the table's meanings, through all three (the page where it can say them)."""
    results = [through_cli(chosen), through_api(chosen)]
    if page_can_say(chosen):
        results.append(through_page(chosen))
    first = results[0]
    assert all(r == first for r in results)
    if isinstance(outcome, str):
        assert first == outcome
    elif isinstance(outcome, tuple):
        assert isinstance(first, RunSpec) and (first.drafter, first.policy, first.gamma) == outcome
    else:
        assert isinstance(first, RunSpec) and first.seed == outcome and first.sampling.seed is None


def test_a_disagreement_would_be_seen(monkeypatch):
    """The negative control: an API that read top_k's field as top_p fails the comparison."""
    from app.serve import parsing
    chosen = {"top_k": 5}
    assert through_cli(chosen) == through_api(chosen)
    monkeypatch.setitem(parsing.SETTING_FIELDS, "top_k", "top_p")
    assert through_cli(chosen) != through_api(chosen)


SCHEMA_DOC = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def through_resolve(chosen: dict, schema: object | None = None) -> RunSpec | str:
    """What the API hands `resolve` (app/serve builds its grammar from the parsed body)."""
    try:
        grammar = None if schema is None else GrammarSpec.schema(schema)
        return resolve(chosen, OFFER, prompt="x", raw=True, grammar=grammar)
    except SettingsError as exc:
        return str(exc)


@pytest.mark.parametrize("schema_text", [
    json.dumps(SCHEMA_DOC), json.dumps(SCHEMA_DOC, indent=4), "true", "[1, 2]", '{"type": '])
def test_a_schema_is_the_same_spec_or_error_from_each_front_end(tmp_path, schema_text):
    """--json-schema's file, the page's schema box and a parsed body make one spec, written the
    same way (so one compiled grammar serves them all), or one message."""
    path = tmp_path / "schema.json"
    path.write_text(schema_text, encoding="utf-8")
    chosen = {"temperature": 0.5, "max_tokens": 32}
    cli = through_cli(chosen, ["--json-schema", str(path)])
    assert through_page(chosen, output=SCHEMA, schema=schema_text) == cli
    try:
        body = json.loads(schema_text)
    except json.JSONDecodeError:
        # Not JSON: no API body can carry it; the CLI and the page refuse it alike.
        assert isinstance(cli, str) and cli.startswith("the JSON schema is not valid JSON")
        return
    assert through_resolve(chosen, body) == cli
    if isinstance(cli, RunSpec):
        assert cli.grammar == GrammarSpec.schema(body) and cli.sampling.temperature == 0.5


def test_the_page_and_the_cli_refuse_an_empty_schema_their_own_way(tmp_path):
    """An empty file is not JSON; an empty box under "JSON schema" asks for one."""
    path = tmp_path / "empty.json"
    path.write_text("", encoding="utf-8")
    assert str(through_cli({}, ["--json-schema", str(path)])).startswith(
        "the JSON schema is not valid JSON")
    assert "paste a JSON schema" in str(through_page({}, output=SCHEMA, schema=""))


@pytest.mark.parametrize("n", [0, 5, 20, 21, -1, 2.5, "x"])
def test_logprobs_are_the_tables_row_on_the_command_line(n):
    """--logprobs N is the top_logprobs row: the same spec or message as a body's field."""
    cli = through_cli({"top_logprobs": n})
    assert cli == through_resolve({"top_logprobs": n})
    if isinstance(cli, RunSpec):
        assert cli.logprobs == n and cli.config.logprobs == n
    else:
        assert cli.startswith("top_logprobs must be")


def test_a_schema_read_without_the_common_form_would_be_seen(tmp_path, monkeypatch):
    """The negative control: a page that kept the box's text as typed makes another spec."""
    from app.runtime import structured
    text = json.dumps(SCHEMA_DOC, indent=4)
    path = tmp_path / "schema.json"
    path.write_text(text, encoding="utf-8")
    cli = through_cli({}, ["--json-schema", str(path)])
    assert through_page({}, output=SCHEMA, schema=text) == cli
    monkeypatch.setattr(structured, "schema_spec", lambda t: GrammarSpec("json_schema", t))
    assert through_page({}, output=SCHEMA, schema=text) != cli


@pytest.mark.parametrize("content", ["def f():\n    return 1\n",
                                     [{"type": "text", "text": "def f():\n"},
                                      {"type": "text", "text": "    return 1\n"}]])
def test_a_prediction_is_the_same_from_a_file_the_box_and_a_body(tmp_path, content):
    """--prediction FILE, the page's "predicted output" box and a body's prediction (a string or
    text parts) make one spec holding the same text."""
    text = "def f():\n    return 1\n"
    path = tmp_path / "f.py"
    path.write_text(text, encoding="utf-8")
    cli = through_cli({}, ["--prediction", str(path)])
    assert isinstance(cli, RunSpec) and cli.prediction == text
    assert through_page({"prediction": text}) == cli
    body = {"prompt": "x", "prediction": {"type": "content", "content": content}}
    assert parse_completion(body, OFFER).spec == cli


def test_a_prediction_read_otherwise_would_be_seen(tmp_path, monkeypatch):
    """The negative control: a command line that dropped the file's last newline differs."""
    from app import settings as cli_settings
    path = tmp_path / "f.py"
    path.write_text("x = 1\n", encoding="utf-8")
    cli = through_cli({}, ["--prediction", str(path)])
    assert cli == through_page({"prediction": "x = 1\n"})
    monkeypatch.setattr(cli_settings, "read_file", lambda p, o: Path(p).read_text().rstrip())
    assert through_cli({}, ["--prediction", str(path)]) != through_page({"prediction": "x = 1\n"})
