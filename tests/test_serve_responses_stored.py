"""Stateful /v1/responses (issue 64) over the byte-level fake pair, driven by the `openai`
client in-process: a response is kept by default (`store`), read back and deleted by id, and
continued with `previous_response_id` (text, and a tool call's output sent back alone, as the
Agents SDK does); an unknown id, and another key's, are 404. The store on its own
(loading/responses.py): user-only files, bounded by count, bytes and age, oldest out first."""
from __future__ import annotations

import os
import stat
import time

import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from loading.responses import ResponseStore
from tests.serve_fakes import byte_pair, serve_access
from tests.test_serve_responses import PERSON, TOOL

GREEDY = {"model": "m", "temperature": 0, "max_output_tokens": 6}


@pytest.fixture(scope="module")
def app():
    queue = GenerationQueue(2)
    # No key set: each bearer token is its own owner (as the history is).
    return create_app(PairHolder(byte_pair(), queue=queue), queue, serve_access(None))


def client_for(app, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key,
                         http_client=TestClient(app), max_retries=0)


@pytest.fixture(scope="module")
def alice(app):
    return client_for(app, "alice")


def test_a_response_is_kept_by_default_read_back_and_deleted(alice):
    made = alice.responses.create(input="Hi", **GREEDY)
    assert made.store is True
    got = alice.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()
    streamed = list(alice.responses.create(input="Hi", stream=True, **GREEDY))
    final = streamed[-1].response
    assert alice.responses.retrieve(final.id).output_text == final.output_text
    deleted = alice.responses.delete(made.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for call in (alice.responses.retrieve, alice.responses.delete):
        with pytest.raises(openai.NotFoundError):
            call(made.id)


def test_store_false_keeps_nothing(alice):
    made = alice.responses.create(input="Hi", store=False, **GREEDY)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.create(input="and?", previous_response_id=made.id, **GREEDY)


def test_previous_response_id_continues_the_conversation_and_its_cache(alice):
    first = alice.responses.create(input="Say a word", instructions="Be brief.", **GREEDY)
    second = alice.responses.create(input="Another", previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    # The same answer as the whole conversation sent again (without the first's instructions,
    # which OpenAI does not carry over).
    whole = alice.responses.create(store=False, **GREEDY, input=[
        {"role": "user", "content": "Say a word"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another"}])
    assert second.output_text == whole.output_text
    assert second.usage.input_tokens == whole.usage.input_tokens > first.usage.input_tokens
    # The second turn found its prefix in the KV cache, and says so as the engine measured it.
    assert 0 < second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens == \
        second.model_extra["speculative"]["prompt_cached_tokens"]
    # A third turn continues the second: its conversation holds all three.
    third = alice.responses.create(input="Last", previous_response_id=second.id, **GREEDY)
    assert third.usage.input_tokens > second.usage.input_tokens


def test_a_tool_calls_output_sent_alone_after_the_call(alice):
    call = alice.responses.create(model="m", input="Weather in Paris?", tools=[TOOL],
                                  tool_choice="required", max_output_tokens=200)
    [fc] = call.output
    assert fc.type == "function_call"
    back = alice.responses.create(
        model="m", tools=[TOOL], tool_choice="none", max_output_tokens=4,
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}])
    assert back.output[0].type == "message" and back.status in ("completed", "incomplete")


def test_the_sdks_stream_helper_reads_the_events_and_chains(alice):
    # The helper wants `response.completed`: an answer the schema ends before max tokens.
    ask = {"model": "m", "temperature": 0, "max_output_tokens": 200,
           "text": {"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                               "strict": True}}}
    with alice.responses.stream(input="A person", **ask) as stream:
        first = stream.get_final_response()
    with alice.responses.stream(input="Another", previous_response_id=first.id, **ask) as stream:
        second = stream.get_final_response()
    assert second.previous_response_id == first.id and second.output_text
    assert alice.responses.retrieve(second.id).output_text == second.output_text


@pytest.mark.parametrize("response_id", ["resp_" + "0" * 32, "resp_1", "..%2F..%2Fetc"])
def test_an_unknown_id_is_404(alice, response_id):
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(response_id)


def test_another_keys_response_is_404(app, alice):
    made = alice.responses.create(input="Hi", **GREEDY)
    bob = client_for(app, "bob")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(input="and?", previous_response_id=made.id, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(made.id)
    assert alice.responses.retrieve(made.id).id == made.id


def record(i: int, size: int = 10) -> dict:
    return {"id": f"resp_{i:032x}", "conversation": [], "response": {"pad": "x" * size}}


def test_the_store_is_user_only_and_bounded_oldest_out_first(tmp_path):
    store = ResponseStore(tmp_path, max_responses=3, max_bytes=10_000, max_age_s=1000)
    now = time.time()
    for i in range(5):
        store.put("local", record(i))
        path = tmp_path / "local" / f"resp_{i:032x}.json"
        os.utime(path, (now - 100 + i, now - 100 + i))  # written one after another
    assert [store.get("local", f"resp_{i:032x}") is not None for i in range(5)] == \
        [False, False, True, True, True]
    assert stat.S_IMODE(os.stat(tmp_path / "local").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # Age: older than the bound is gone at the next put (the files' own times say how old).
    young = ResponseStore(tmp_path, max_responses=100, max_bytes=10**9, max_age_s=60)
    young.put("local", record(20))
    assert not any(young.get("local", f"resp_{i:032x}") for i in range(5))
    assert young.get("local", record(20)["id"])
    # Bytes: one over the bound alone pushes out every older one, never itself.
    store.put("local", record(21))
    store.put("local", record(9, size=10_000))
    assert store.get("local", record(9)["id"]) is not None
    assert not store.get("local", record(20)["id"]) and not store.get("local", record(21)["id"])
    # Owners and ids that are not the server's own are refused or not found.
    with pytest.raises(ValueError):
        store.get("../x", record(1)["id"])
    assert store.get("local", "resp_../../x") is None


def test_an_unreadable_stored_response_is_set_aside_and_not_found(tmp_path, capsys):
    store = ResponseStore(tmp_path)
    store.put("local", record(1))
    (tmp_path / "local" / f"resp_{1:032x}.json").write_text("{not json")
    assert store.get("local", record(1)["id"]) is None
    assert list((tmp_path / "local").glob("*.corrupt-*"))
