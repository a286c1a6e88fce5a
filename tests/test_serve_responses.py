"""/v1/responses (OpenAI's Responses API) over the byte-level fake pair, driven by the `openai`
client in-process: text, streamed events, tools (a call, its arguments streamed, the call and
its output sent back), a `json_schema` format, and the fields it refuses (issue 48). Stored
responses: tests/test_serve_responses_stored.py."""
from __future__ import annotations

import json

import jsonschema_rs
import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from tests.serve_fakes import API_KEY, AUTH, byte_pair, serve_access

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 6}}}
TOOL = {"type": "function", "name": "get_weather", "description": "today's weather",
        "parameters": WEATHER, "strict": True}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}}}


@pytest.fixture(scope="module")
def client():
    queue = GenerationQueue(2)
    app = create_app(PairHolder(byte_pair(), queue=queue), queue, serve_access())
    return TestClient(app, headers=AUTH)


@pytest.fixture(scope="module")
def oai(client):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY,
                         http_client=TestClient(client.app), max_retries=0)


def test_a_text_response_whole_and_streamed(oai):
    whole = oai.responses.create(model="anything", input="Hi", instructions="Be brief.",
                                 max_output_tokens=8)
    assert whole.object == "response" and whole.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 8 and whole.output[0].type == "message"
    assert whole.output_text == whole.output[0].content[0].text
    events = list(oai.responses.create(model="anything", input="Hi", max_output_tokens=8,
                                       stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output[0].content[0].text == whole.output_text


def test_a_required_call_its_arguments_streamed_and_the_round_trip(oai):
    ask = {"model": "m", "input": "Weather in Paris?", "tools": [TOOL],
           "tool_choice": "required", "max_output_tokens": 200}
    whole = oai.responses.create(**ask)
    [call] = whole.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema_rs.validate(WEATHER, json.loads(call.arguments))
    events = list(oai.responses.create(**ask, stream=True))
    args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(args) > 1 and done[0].arguments == "".join(args)
    assert events[-1].type == "response.completed"
    # The call and its output fed back: a text answer (tool_choice none).
    back = oai.responses.create(model="m", tools=[TOOL], tool_choice="none", max_output_tokens=4,
                                input=[{"role": "user", "content": "Weather in Paris?"},
                                       {"type": "function_call", "call_id": call.call_id,
                                        "name": call.name, "arguments": call.arguments},
                                       {"type": "function_call_output", "call_id": call.call_id,
                                        "output": "sunny"}])
    assert back.output[0].type == "message"


def test_a_json_schema_format(oai):
    out = oai.responses.create(model="m", input="A person", max_output_tokens=200,
                               text={"format": {"type": "json_schema", "name": "person",
                                                "schema": PERSON, "strict": True}})
    jsonschema_rs.validate(PERSON, json.loads(out.output_text))


@pytest.mark.parametrize("fields, param", [
    ({"store": "yes"}, "store"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"previous_response_id": 7}, "previous_response_id"),
    ({"input": []}, "input"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ({"temperature": -1}, "temperature"),
])
def test_what_it_cannot_do_is_refused_by_name(client, fields, param):
    r = client.post("/v1/responses", json={"input": "Hi", **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
