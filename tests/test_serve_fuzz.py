"""`tandem serve` fuzzed from its own OpenAPI document (issue 38): schemathesis generates valid
and invalid requests from /openapi.json (app/serve/openapi.py) and sends them to a real server
process on loopback over the byte-level fake pair (tests/fakeserve.py, TANDEM_FAKE_PAIR=bytes:
response_format schemas and tools compile on it). Every answer must be a status the
document lists for its route, with the OpenAI-style JSON error body when it is not a 200, never
a 5xx; afterwards the log holds no traceback and the server still answers a plain request.

A bounded run (derandomized, the same cases every time) in the default suite, ten times as many
with --all. The counts of the last run are in docs/RELIABILITY.md.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode, Response

from app.serve.openapi import SAMPLING, document
from app.serve.responses_request import RESPONSES_FIELDS
from app.serve.parsing import CHAT_FIELDS, COMPLETION_FIELDS, MESSAGE_FIELDS, SPECULATIVE_FIELDS
from tests.test_serve_security import KEY, Server

DEFAULT_CASES = 200
LONG_CASES = 4000
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The byte-level pair: response_format and tools compile and constrain on it.
    s = Server("serve", tmp_path_factory.mktemp("fuzz"), env={"TANDEM_FAKE_PAIR": "bytes"})
    yield s
    s.stop()


def test_the_document_lists_exactly_the_fields_the_server_takes():
    schemas = document()["components"]["schemas"]
    assert set(schemas["ChatRequest"]["properties"]) == set(CHAT_FIELDS)
    assert set(schemas["CompletionRequest"]["properties"]) == set(COMPLETION_FIELDS)
    assert set(schemas["ResponsesRequest"]["properties"]) == set(RESPONSES_FIELDS)
    assert set(SAMPLING["speculative"]["properties"]) == set(SPECULATIVE_FIELDS)
    message = schemas["ChatRequest"]["properties"]["messages"]["items"]
    assert set(message["properties"]) == set(MESSAGE_FIELDS)


def test_the_server_publishes_the_document_and_framework_errors_are_api_errors(server):
    r = server.request("GET", "/openapi.json")
    assert r.status_code == 200 and r.json() == document()
    assert server.request("GET", "/openapi.json", key=False).status_code == 401
    for method, path, status in (("GET", "/nowhere", 404), ("PUT", "/health", 405),
                                 ("DELETE", "/openapi.json", 405)):
        r = server.request(method, path)
        assert r.status_code == status, r.text
        assert "\n" not in r.json()["error"]["message"]


def check(case: Case, response: Response, seen: Counter) -> None:
    """One generated request's answer against the document."""
    status = response.status_code
    label = f"{case.method} {case.path} {case.body!r:.300}"
    seen[status] += 1
    assert status < 500, f"{label}: {status} {response.text[:500]}"
    documented = case.operation.definition.raw["responses"]
    assert str(status) in documented, f"{label}: {status} is not documented"
    kind = (response.headers.get("content-type") or [""])[0]
    if status == 200:
        if kind.startswith("text/event-stream"):
            # schemathesis reads a few events and closes the stream (a cancelled stream): each
            # complete event is a chunk, or the end.
            events = [e for e in response.text.split("\n\n")[:-1] if e.strip()]
            assert events, label
            for event in events:
                if case.path == "/v1/responses":  # typed events: `event: TYPE`, its data
                    kind_line, _, data = event.partition("\ndata: ")
                    assert json.loads(data)["type"] == kind_line.removeprefix("event: "), label
                    continue
                data = event.removeprefix("data: ")
                assert data == "[DONE]" or "choices" in json.loads(data), f"{label}: {event}"
        else:
            assert kind.startswith("application/json"), label
        return
    assert kind.startswith("application/json"), f"{label}: {status} {kind}"
    error = json.loads(response.text)["error"]
    assert isinstance(error["message"], str) and "\n" not in error["message"], label
    assert isinstance(error["type"], str), label


def short(case: Case) -> Case:
    """Answers of 16 tokens where the request leaves the length to the server (its default,
    256, would spend the run generating); lengths the request gives are sent as generated."""
    body = case.body
    length = "max_output_tokens" if case.path == "/v1/responses" else "max_tokens"
    if isinstance(body, dict) and body.get(length) is None \
            and body.get("max_completion_tokens") is None:
        body[length] = 16
    return case


def fuzz(server: Server, n: int) -> Counter:
    schema = schemathesis.openapi.from_dict(document())
    cases = st.one_of(schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
                      schema.as_strategy(generation_mode=GenerationMode.NEGATIVE)).map(short)
    seen: Counter = Counter()

    @settings(max_examples=n, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def one(case) -> None:
        response = case.call(base_url=server.url, headers=AUTH, timeout=60)
        check(case, response, seen)

    one()
    return seen


def _fuzz_and_check(server: Server, n: int, capsys) -> None:
    seen = fuzz(server, n)
    with capsys.disabled():
        print(f"\nfuzzed {sum(seen.values())} requests: "
              + ", ".join(f"{s}: {c}" for s, c in sorted(seen.items())))
    # Both kinds of answer were reached: answers and refusals.
    assert seen[200] and sum(c for s, c in seen.items() if 400 <= s < 500)
    r = server.request("POST", "/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    assert "Traceback" not in server.output(), server.output()[-3000:]


def test_requests_generated_from_the_document_get_documented_answers(server, capsys):
    _fuzz_and_check(server, DEFAULT_CASES, capsys)


@pytest.mark.long
def test_ten_times_as_many_generated_requests(server, capsys):
    _fuzz_and_check(server, LONG_CASES, capsys)
