"""The API in-process over a fake pair: response shapes, streaming, per-request settings and
every bad input, through raw HTTP and through the openai client (no model, no network)."""
from __future__ import annotations

import json
import logging

import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from app.runtime.holder import PairHolder
from app.serve.parsing import MAX_JSON_DEPTH
from tests.serve_fakes import API_KEY, MODEL, N_CTX, api_client, serve_access

HI = [{"role": "user", "content": "hi there"}]
JSON = {"Content-Type": "application/json"}
FIXED = {"drafter": "draft", "policy": "fixed", "gamma": 3}


@pytest.fixture
def client():
    c, _ = api_client()
    return c


@pytest.fixture
def oai(client):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY, http_client=client,
                         max_retries=0)


def events(response) -> list:
    lines = [ln[len("data: "):] for ln in response.text.split("\n\n") if ln]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def assert_error(response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "\n" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["drafters"] == ["plain", "draft", "hybrid", "lookup", "suffix"]
    assert models["data"][0]["pair"] == {"target": "fake-1-0.0", "draft": "fake-1-0.5"}
    health = TestClient(client.app).get("/health")  # no key needed
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["queue"] == {"running": 0, "waiting": 0, "max_waiting": 2, "parallel": 1}


def test_a_chat_completion_has_choices_usage_and_speculative_stats(client):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 12,
                                                  "speculative": FIXED})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12
    spec = body["speculative"]
    assert spec["mode"] == "speculative" and spec["drafter"] == "draft"
    assert spec["drafted_tokens"] > 0 and 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"], abs=1e-4)
    assert spec["target_calls"] == spec["rounds"] == len(spec["controller"]["gammas"])
    assert spec["target_calls"] < 12  # accepted drafts saved target calls
    assert spec["tokens_per_s"] > 0 and spec["ttft_ms"] > 0
    controller = spec["controller"]
    assert controller["policy"] == "fixed" and controller["max_gamma"] == 3
    assert max(controller["gammas"]) == 3
    assert controller["reason"] == "fixed: gamma 3 every round"


def test_a_streamed_chat_matches_the_whole_answer_and_ends_with_stats(client):
    body = {"messages": HI, "max_tokens": 10, "speculative": FIXED}
    whole = client.post("/v1/chat/completions", json=body).json()
    r = client.post("/v1/chat/completions", json={**body, "stream": True,
                                                  "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) > 1
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    final = chunks[-1]
    # The same prompt again: the cache held it this time (all of it but its last token).
    details = final["usage"].pop("prompt_tokens_details")
    assert details == {"cached_tokens": whole["usage"]["prompt_tokens"] - 1}
    whole["usage"].pop("prompt_tokens_details")
    assert final["choices"] == [] and final["usage"] == whole["usage"]
    assert final["speculative"]["drafted_tokens"] == whole["speculative"]["drafted_tokens"]
    # Without include_usage the final chunk still carries the statistics, not the usage.
    plain = events(client.post("/v1/chat/completions", json={**body, "stream": True}))[-1]
    assert "usage" not in plain and plain["speculative"]["controller"]["policy"] == "fixed"


def test_a_text_completion_is_raw_and_streams(client):
    r = client.post("/v1/completions", json={"prompt": "def f():", "max_tokens": 6, "stop": "zzz"})
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"]
    # Raw: the fake tokenizer gives one token per byte, and no chat template was added.
    assert body["usage"]["prompt_tokens"] == len("def f():")
    chunks = events(client.post("/v1/completions", json={"prompt": "def f():", "max_tokens": 6,
                                                          "stream": True}))
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == body["choices"][0]["text"] and chunks[-1]["speculative"]["mode"] == "speculative"


def test_greedy_speculation_gives_the_plain_answer(client):
    def answer(spec: dict) -> dict:
        return client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 16,
                                                         "speculative": spec}).json()
    plain = answer({"drafter": "plain"})
    assert plain["speculative"]["mode"] == "plain" and plain["speculative"]["drafted_tokens"] == 0
    assert plain["speculative"]["controller"]["policy"] is None
    for spec in (FIXED, {"drafter": "lookup", "policy": "heuristic", "gamma": 2}, {}):
        out = answer(spec)
        assert out["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert out["speculative"]["drafter"] == spec.get("drafter", "hybrid")


def test_a_stop_string_ends_the_answer(client):
    full = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 12}).json()
    text = full["choices"][0]["text"]
    stop = text[4:6]
    cut = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 12, "stop": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[:text.index(stop)]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {API_KEY}"}])
def test_a_missing_or_wrong_key_is_401(route, headers):
    c, _ = api_client()
    r = TestClient(c.app, headers=headers).post(route, json={"prompt": "x", "messages": HI})
    assert_error(r, 401, code="invalid_api_key")
    assert_error(TestClient(c.app, headers=headers).get("/v1/models"), 401)


def test_without_a_key_set_no_key_is_needed():
    c, _ = api_client(api_key=None)
    assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("content", [b"{bad json", b"[]", b"\xff"])
def test_malformed_json_is_400(client, content):
    assert_error(client.post("/v1/chat/completions", content=content, headers=JSON), 400,
                 code="invalid_json")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_too_deep_is_400_not_a_traceback(client, depth, caplog):
    body = b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"
    error = assert_error(client.post("/v1/chat/completions", content=body, headers=JSON), 400,
                         code="invalid_json")
    assert f"more than {MAX_JSON_DEPTH} levels" in error["message"]
    assert not [r for r in caplog.records if r.exc_info]


def test_a_body_nested_as_deep_as_allowed_is_read(client):
    # One level for the body, one for the list: the deepest a "stop" value may nest.
    stop = json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))
    assert_error(client.post("/v1/chat/completions", json={"messages": HI, "stop": stop}), 400,
                 param="stop")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_body_that_is_not_sent_as_json_is_415(client, content_type):
    # A web page can send these to any server without a preflight; JSON it cannot.
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    error = assert_error(client.post("/v1/chat/completions", content=body, headers=headers), 415,
                         code="unsupported_media_type")
    assert "application/json" in error["message"]
    ok = client.post("/v1/chat/completions", content=body,
                     headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_an_unknown_field_is_400_naming_it(client):
    r = client.post("/v1/chat/completions", json={"messages": HI, "presence_penalty": 1})
    error = assert_error(r, 400, param="presence_penalty")
    assert "presence_penalty" in error["message"]


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0), ("top_k", -3),
                                          ("min_p", 2), ("max_tokens", 0), ("seed", 1.5)])
def test_a_bad_sampling_value_is_400(client, field, value):
    assert_error(client.post("/v1/chat/completions", json={"messages": HI, field: value}), 400,
                 param=field)


def test_any_model_name_is_answered_by_the_served_model(client):
    # As llama-server does: some clients send a fixed name.
    out = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HI,
                                                     "max_tokens": 2})
    assert out.status_code == 200 and out.json()["model"] == MODEL


def test_an_unknown_route_is_404(client):
    assert_error(client.get("/v1/embeddings"), 404, code="unknown_url")


def test_a_prompt_longer_than_the_context_is_413(client):
    long = "x" * (N_CTX + 10)
    assert_error(client.post("/v1/completions", json={"prompt": long}), 413, param="prompt",
                 code="context_length_exceeded")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long}]}),
                 413, param="messages")
    # One token short of the context still runs: the engine needs a single free position.
    fits = client.post("/v1/completions", json={"prompt": "x" * (N_CTX - 1), "max_tokens": 4})
    assert fits.status_code == 200 and fits.json()["choices"][0]["finish_reason"] == "length"


def test_max_tokens_beyond_the_context_is_400(client):
    for field in ("max_tokens", "max_completion_tokens"):
        for value in (10**12, N_CTX + 1):
            r = client.post("/v1/completions", json={"prompt": "x", field: value})
            assert str(N_CTX) in assert_error(r, 400, param=field)["message"]
    # As many as the context holds is asked for; the answer ends at the context's end.
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": N_CTX})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_an_oversized_body_is_413(client):
    r = client.post("/v1/completions", content=b"{" + b" " * (9 * 1024 * 1024) + b"}", headers=JSON)
    assert_error(r, 413, code="request_too_large")


def test_an_oversized_body_without_a_length_is_413(client):
    def chunks():  # sent chunked: no Content-Length to refuse it by
        yield b"{"
        for _ in range(9):
            yield b" " * (1024 * 1024)
        yield b"}"
    r = client.post("/v1/completions", content=chunks(), headers=JSON)
    assert_error(r, 413, code="request_too_large")


def test_a_full_queue_is_503_with_retry_after(caplog):
    c, queue = api_client(max_queue=0)
    running = queue.join()  # another generation holds the pair
    try:
        r = c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert_error(r, 503, code="queue_full")
        assert int(r.headers["retry-after"]) >= 1
        assert_error(c.post("/v1/completions", json={"prompt": "x", "stream": True}), 503)
    finally:
        queue.leave(running)
    assert c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}).status_code == 200
    # Each refusal is one line in the log, not a traceback.
    refused = [r for r in caplog.records if r.name == "tandem.serve"]
    assert len(refused) == 2 and all(r.levelno == logging.WARNING and not r.exc_info
                                     and "busy" in r.getMessage() for r in refused)
    assert queue.snapshot() == {"running": 0, "waiting": 0, "max_waiting": 0, "parallel": 1}


def test_no_loaded_pair_is_503():
    queue = GenerationQueue(2)
    holder = PairHolder(queue=queue)
    holder.fail("the target file is missing")
    c = TestClient(create_app(holder, queue, serve_access(None)))
    assert_error(c.post("/v1/completions", json={"prompt": "x"}), 503)
    assert c.get("/health").status_code == 503 and c.get("/health").json()["status"] == "error"


def test_an_engine_failure_is_500_and_the_server_serves_on(client, monkeypatch, caplog):
    from engine.pair import Pair

    def broken(self, *args, **kwargs):
        raise RuntimeError("boom")
        yield  # a generator, like the real one

    pair_generate = Pair.generate_tokens
    monkeypatch.setattr(Pair, "generate_tokens", broken)
    assert_error(client.post("/v1/completions", json={"prompt": "x"}), 500, code="internal_error")
    assert any(r.exc_info for r in caplog.records)  # a server fault keeps its traceback
    chunks = events(client.post("/v1/chat/completions", json={"messages": HI, "stream": True}))
    assert chunks[-1]["error"]["code"] == "internal_error" and "boom" in chunks[-1]["error"]["message"]
    monkeypatch.setattr(Pair, "generate_tokens", pair_generate)
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_the_openai_client_reads_answers_and_stats(oai):
    chat = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0.7,
                                       top_p=0.9, seed=1, extra_body={"top_k": 20, "min_p": 0.01,
                                                                      "speculative": FIXED})
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
    assert chat.speculative["controller"]["max_gamma"] == 3
    again = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0.7,
                                        top_p=0.9, seed=1, extra_body={"top_k": 20, "min_p": 0.01,
                                                                       "speculative": FIXED})
    assert again.choices[0].message.content == chat.choices[0].message.content  # same seed
    stream = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].speculative["mode"] == "speculative"
    text = oai.completions.create(model=MODEL, prompt="def f():", max_tokens=4)
    assert text.choices[0].text and text.speculative["drafter"] == "hybrid"


def test_the_openai_client_sees_each_error_status(client, oai):
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model=MODEL, input="x")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.chat.completions.create(model=MODEL, messages=HI, temperature=-2)
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        oai.chat.completions.create(model=MODEL, messages=HI, frequency_penalty=0.5)
    with pytest.raises(openai.APIStatusError) as info:
        oai.completions.create(model=MODEL, prompt="x" * (N_CTX + 1))
    assert info.value.status_code == 413
    bad_key = openai.OpenAI(base_url="http://testserver/v1", api_key="nope",
                            http_client=TestClient(client.app), max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_a_second_turn_reports_the_prompt_tokens_the_cache_held(client):
    first = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 6}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["speculative"]["prompt_computed_tokens"] == first["usage"]["prompt_tokens"]
    turn = HI + [first["choices"][0]["message"], {"role": "user", "content": "and more"}]
    second = client.post("/v1/chat/completions", json={"messages": turn, "max_tokens": 6}).json()
    cached = second["speculative"]["prompt_cached_tokens"]
    assert cached == second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert cached + second["speculative"]["prompt_computed_tokens"] == second["usage"]["prompt_tokens"]


def long_chat(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"question {i} " + "word " * 8},
                 {"role": "assistant", "content": "answer " * 6}]
    return msgs + [{"role": "user", "content": "the last question"}]


def test_a_chat_longer_than_the_context_is_refused_unless_it_asks_for_a_policy(client):
    body = {"messages": long_chat(N_CTX // 40), "max_tokens": 8}
    assert_error(client.post("/v1/chat/completions", json=body), 413, param="messages")
    assert_error(client.post("/v1/chat/completions", json={**body, "context_overflow": "stop"}),
                 413, param="messages")
    for policy in ("drop-oldest", "truncate-middle"):
        r = client.post("/v1/chat/completions", json={**body, "context_overflow": policy})
        assert r.status_code == 200, r.text
        dropped = int(r.headers["x-tandem-dropped-messages"])
        assert 0 < dropped < len(body["messages"]) - 2
        assert r.json()["usage"]["prompt_tokens"] + 8 <= N_CTX
    short = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4,
                                                      "context_overflow": "drop-oldest"})
    assert short.headers["x-tandem-dropped-messages"] == "0"
    assert "x-tandem-dropped-messages" not in client.post(
        "/v1/chat/completions", json={"messages": HI, "max_tokens": 4}).headers
    assert_error(client.post("/v1/chat/completions", json={**body, "context_overflow": "rolling"}),
                 400, param="context_overflow")
