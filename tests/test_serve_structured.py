"""Structured outputs, tool calls and log probabilities through the API (issue 37), over the
byte-level fake pair (tests/byte_fake.py), whose answers are random bytes: only the grammar
makes them JSON or tool calls, which is the point. In-process (a TestClient) for the refusals and
the exact shapes; then the `openai` client against a `tandem serve` process, with speculation
on (a draft model drafting 4 tokens a round): a tool-call round trip and a `json_schema` answer
that validates, streamed and not."""
from __future__ import annotations

import json

import jsonschema_rs
import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from engine.errors import GrammarError
from engine.grammar.llg import compile_grammar
from engine.grammar.spec import GrammarSpec
from tests.serve_fakes import AUTH, byte_pair, serve_access
from tests.test_serve_security import KEY, Server

HI = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 8},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["a", "b"]}}}}
PERSON_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
# Speculation on, whatever the policy would predict for these fakes.
SPECULATIVE = {"drafter": "draft", "policy": "fixed", "gamma": 4}
LONG = 300


@pytest.fixture(scope="module")
def client():
    queue = GenerationQueue(2)
    app = create_app(PairHolder(byte_pair(), queue=queue), queue, serve_access())
    return TestClient(app, headers=AUTH)


def post(client, **body):
    return client.post("/v1/chat/completions", json={"messages": HI, **body})


def chunks(response) -> list[dict]:
    lines = [ln.removeprefix("data: ") for ln in response.text.split("\n\n") if ln]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def refusal(response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    return error["message"]


# --- refusals ------------------------------------------------------------------------------

def test_a_schema_the_constraint_engine_refuses_is_a_400_with_its_message(client):
    bad = {"type": "object", "properties": {"a": {"type": "wat"}}}
    message = refusal(post(client, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": bad}}), "response_format")
    with pytest.raises(GrammarError) as llguidance:
        compile_grammar(GrammarSpec.schema(bad), byte_pair().target.backend)
    assert message == str(llguidance.value) and "wat" in message
    # The same for a tool's parameters, and a streamed request is refused before it starts.
    tools = [{"type": "function", "function": {"name": "f", "parameters": bad}}]
    assert refusal(post(client, tools=tools, stream=True),
                   "tools[0].function.parameters") == message


def test_a_schema_the_converter_cannot_read_is_a_400_too(client):
    # Found by the fuzzer: llguidance's JSON reader refuses integers past 64 bits with a ValueError.
    huge = {"type": "integer", "minimum": -2 ** 63 - 1}
    assert "not JSON serializable" in refusal(post(client, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": huge}}), "response_format")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": huge}}}}]
    assert refusal(post(client, tools=tools), "tools[0].function.parameters")


@pytest.mark.parametrize("fmt, param", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "format": 1}},
     "response_format.json_schema.format"),
])
def test_a_malformed_response_format_is_refused_by_name(client, fmt, param):
    refusal(post(client, response_format=fmt), param)


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": {"get_weather": {}}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
])
def test_malformed_tool_fields_are_refused_by_name(client, fields, param):
    refusal(post(client, **fields), param)


def test_a_tool_choice_naming_a_missing_function_says_which(client):
    message = refusal(post(client, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "send_mail"}}), "tool_choice.function.name")
    assert "send_mail" in message and "get_weather, get_time" in message


# --- shapes --------------------------------------------------------------------------------

def test_a_named_tool_call_and_its_streamed_deltas_in_openais_format(client):
    body = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": LONG, "temperature": 0, "speculative": SPECULATIVE}
    whole = post(client, **body).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    jsonschema_rs.validate(WEATHER, json.loads(call["function"]["arguments"]))

    got = chunks(post(client, **body, stream=True))
    deltas = [c["choices"][0]["delta"] for c in got if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    head = deltas[1]["tool_calls"]
    assert head == [{"index": 0, "id": head[0]["id"], "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]
    # The arguments as they are drawn, in several deltas.
    args = [d["tool_calls"] for d in deltas[2:] if d.get("tool_calls")]
    assert len(args) > 1 and all(a[0]["index"] == 0 and set(a[0]) == {"index", "function"}
                                 for a in args)
    assert json.loads("".join(a[0]["function"]["arguments"] for a in args)) == \
        json.loads(call["function"]["arguments"])
    assert [c["choices"][0]["finish_reason"] for c in got if c["choices"]][-1] == "tool_calls"


def test_required_gives_one_call_unless_parallel_calls_are_asked_for(client):
    body = {"tools": TOOLS[:1], "tool_choice": "required", "max_tokens": LONG, "temperature": 0}
    message = post(client, **body).json()["choices"][0]["message"]
    assert len(message["tool_calls"]) == 1
    # Asked for: calls may follow, but never one identical to an earlier one.
    for seed in range(3):
        choice = post(client, **{**body, "temperature": 0.8}, seed=seed,
                      parallel_tool_calls=True).json()["choices"][0]
        keys = [(c["function"]["name"], c["function"]["arguments"])
                for c in choice["message"].get("tool_calls") or ()]
        assert len(keys) == len(set(keys))


def test_tools_on_completions_in_the_templates_syntax(client):
    body = {"prompt": "Call get_weather.\n", "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": LONG, "temperature": 0}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["text"] == ""
    assert [c["function"]["name"] for c in choice["tool_calls"]] == ["get_weather"]


def test_tool_choice_none_answers_text(client):
    choice = post(client, tools=TOOLS, tool_choice="none", max_tokens=8).json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert isinstance(choice["message"]["content"], str)


@pytest.mark.parametrize("speculative", [{"drafter": "plain"}, SPECULATIVE], ids=["plain", "draft"])
def test_logprobs_in_chat_answers_whole_and_streamed(client, speculative):
    body = {"max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3,
            "speculative": speculative}
    whole = post(client, **body).json()
    entries = whole["choices"][0]["logprobs"]["content"]
    assert len(entries) == whole["usage"]["completion_tokens"] == 12
    for e in entries:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and e["logprob"] <= 0
        assert len(e["top_logprobs"]) == 3 and bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and e["logprob"] <= tops[0] + 1e-6
    streamed = [e for c in chunks(post(client, **body, stream=True)) if c["choices"]
                and c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == entries
    # logprobs without top_logprobs: no alternatives; without logprobs: null.
    bare = post(client, max_tokens=3, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert len(bare) == 3 and all(e["top_logprobs"] == [] for e in bare)
    assert post(client, max_tokens=3).json()["choices"][0]["logprobs"] is None


def test_logprobs_on_legacy_completions(client):
    out = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "logprobs": 2,
                                               "temperature": 0}).json()
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert all(len(t) <= 2 for t in lp["top_logprobs"]) and lp["text_offset"][0] == 0
    assert client.post("/v1/completions", json={"prompt": "abc", "top_logprobs": 2}).status_code == 400


def test_json_object_answers_are_objects(client):
    # A random model may write one key for ever: every answer that ends is an object, and some end.
    ended = 0
    for seed in range(6):
        answer = post(client, response_format={"type": "json_object"}, max_tokens=LONG,
                      temperature=0.7, seed=seed).json()["choices"][0]
        assert answer["message"]["content"].startswith("{")
        if answer["finish_reason"] == "stop":
            assert isinstance(json.loads(answer["message"]["content"]), dict)
            ended += 1
    assert ended


def test_logprobs_under_a_grammar_with_speculation(client):
    # Every committed token has its entry, forced ones and the end's round included.
    out = post(client, response_format=PERSON_FORMAT, max_tokens=LONG, temperature=0.7, seed=2,
               logprobs=True, speculative=SPECULATIVE).json()
    assert len(out["choices"][0]["logprobs"]["content"]) == out["usage"]["completion_tokens"]
    jsonschema_rs.validate(PERSON, json.loads(out["choices"][0]["message"]["content"]))


# --- the openai client against a tandem serve process -----------------------------------------

@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    server = Server("serve", tmp_path_factory.mktemp("structured"), env={"TANDEM_FAKE_PAIR": "bytes"})
    yield openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert "Traceback" not in server.output(), server.output()[-3000:]
    server.stop()


def streamed_call(stream) -> tuple[list[dict], str | None, dict]:
    """The tool calls of a streamed answer, put together from their deltas as clients do."""
    calls: dict[int, dict] = {}
    finish, stats = None, {}
    for chunk in stream:
        if not chunk.choices:
            stats = chunk.model_extra["speculative"]
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish, stats


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_round_trip_through_the_openai_client(oai, stream):
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    ask = dict(model="bytes-1-0.0", tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
               max_tokens=LONG, temperature=0.7, seed=5,
               extra_body={"speculative": SPECULATIVE})
    if stream:
        calls, finish, stats = streamed_call(oai.chat.completions.create(
            messages=messages, stream=True, **ask))
    else:
        out = oai.chat.completions.create(messages=messages, **ask)
        finish, stats = out.choices[0].finish_reason, out.model_extra["speculative"]
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in out.choices[0].message.tool_calls or ()]
    assert finish == "tool_calls" and len(calls) == 1
    assert stats["mode"] == "speculative" and stats["drafted_tokens"] > 0
    call = calls[0]
    arguments = json.loads(call["arguments"])
    schema = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
              for t in TOOLS}[call["name"]]
    jsonschema_rs.validate(schema, arguments)
    # The call and its result go back; the answer is text.
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call["id"], "type": "function",
                      "function": {"name": call["name"], "arguments": call["arguments"]}}]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees, sunny"}]
    final = oai.chat.completions.create(
        messages=messages, **{**ask, "tool_choice": "none", "max_tokens": 8})
    assert final.choices[0].message.tool_calls is None
    assert isinstance(final.choices[0].message.content, str) and final.usage.completion_tokens == 8


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_answer_through_the_openai_client_validates(oai, stream):
    ask = dict(model="bytes-1-0.0", messages=HI, response_format=PERSON_FORMAT, max_tokens=LONG,
               temperature=0.7, seed=11, extra_body={"speculative": SPECULATIVE})
    if stream:
        text, stats, finish = "", {}, None
        for chunk in oai.chat.completions.create(stream=True, **ask):
            if not chunk.choices:
                stats = chunk.model_extra["speculative"]
                continue
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    else:
        out = oai.chat.completions.create(**ask)
        text, finish = out.choices[0].message.content, out.choices[0].finish_reason
        stats = out.model_extra["speculative"]
    assert finish == "stop", text
    jsonschema_rs.validate(PERSON, json.loads(text))
    assert stats["drafted_tokens"] > 0 and stats["accepted_tokens"] > 0
    # Keys, colons and brackets the schema allows alone are committed without a model.
    assert stats["forced_tokens"] > 0
