"""Predicted outputs through the API (OpenAI's `prediction`) over a fake pair in-process: the
answer is the target's whatever the prediction, the usage counts the prediction's accepted and
rejected tokens (whole, streamed, and on /v1/responses), the openai client sends the field and
reads the figures, and every bad prediction is a 400 naming it."""
from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from engine.pair import Pair
from tests.byte_fake import AsciiFake
from tests.serve_fakes import API_KEY, AUTH, serve_access

N_CTX = 1024
ASK = [{"role": "user", "content": "rewrite this"}]
LOOKUP = {"drafter": "lookup", "policy": "fixed", "gamma": 4}
HYBRID = {"drafter": "hybrid", "policy": "fixed", "gamma": 4}
DETAILS = ("reasoning_tokens", "audio_tokens", "accepted_prediction_tokens",
           "rejected_prediction_tokens")


@pytest.fixture(scope="module")
def client():
    queue = GenerationQueue(2)
    pair = Pair(AsciiFake(seed=1, n_ctx=N_CTX), AsciiFake(seed=1, noise=0.5, n_ctx=N_CTX))
    return TestClient(create_app(PairHolder(pair, queue=queue), queue, serve_access()),
                      headers=AUTH)


def chat(client, speculative: dict, prediction=None, **more) -> dict:
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0, "speculative": speculative,
            **more}
    if prediction is not None:
        body["prediction"] = prediction
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def plain(client) -> str:
    text = chat(client, {"drafter": "plain"})["choices"][0]["message"]["content"]
    assert len(text) == 40 and text.isascii()
    return text


def details(body: dict) -> dict:
    out = body["usage"]["completion_tokens_details"]
    assert tuple(out) == DETAILS
    return out


@pytest.mark.parametrize("speculative", [LOOKUP, HYBRID])
def test_the_answer_as_prediction_is_copied_and_counted(client, plain, speculative):
    body = chat(client, speculative, {"type": "content", "content": plain})
    assert body["choices"][0]["message"]["content"] == plain
    got = details(body)
    assert got["accepted_prediction_tokens"] > 30 and got["rejected_prediction_tokens"] == 0
    spec = body["speculative"]
    assert spec["by_source"]["prediction"]["accepted"] == got["accepted_prediction_tokens"]
    assert spec["target_calls"] < 40 - 30 + 1


def test_a_wrong_prediction_leaves_the_answer_the_targets_and_counts_its_rejections(client, plain):
    wrong = plain[:15] + ("#" if plain[15] != "#" else "%") + plain[16:]
    body = chat(client, LOOKUP, {"type": "content", "content": wrong})
    assert body["choices"][0]["message"]["content"] == plain
    got = details(body)
    assert got["rejected_prediction_tokens"] > 0 and got["accepted_prediction_tokens"] > 20


def test_text_parts_are_read_as_their_joined_text(client, plain):
    parts = [{"type": "text", "text": plain[:10]}, {"type": "text", "text": plain[10:]}]
    assert details(chat(client, LOOKUP, {"type": "content", "content": parts})) == details(
        chat(client, LOOKUP, {"type": "content", "content": plain}))


def test_without_a_prediction_and_with_plain_decoding_the_counts_are_zero(client, plain):
    zero = {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0}
    assert details(chat(client, LOOKUP)) == zero
    # Plain decoding has nothing to draft: the field is accepted, as OpenAI accepts it, and
    # changes nothing.
    body = chat(client, {"drafter": "plain"}, {"type": "content", "content": plain})
    assert details(body) == zero and body["choices"][0]["message"]["content"] == plain


def test_the_streamed_usage_carries_the_same_figures(client, plain):
    prediction = {"type": "content", "content": plain}
    whole = chat(client, LOOKUP, prediction)
    r = client.post("/v1/chat/completions", json={
        "messages": ASK, "max_tokens": 40, "temperature": 0, "speculative": LOOKUP,
        "prediction": prediction, "stream": True, "stream_options": {"include_usage": True}})
    lines = [ln[len("data: "):] for ln in r.text.split("\n\n") if ln]
    chunks = [json.loads(ln) for ln in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain
    assert details(chunks[-1]) == details(whole)


def test_the_openai_client_sends_the_prediction_and_reads_the_usage(client, plain):
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY, http_client=client,
                        max_retries=0)
    out = oai.chat.completions.create(
        model="m", messages=ASK, max_tokens=40, temperature=0,
        prediction={"type": "content", "content": plain}, extra_body={"speculative": LOOKUP})
    assert out.choices[0].message.content == plain
    usage = out.usage.completion_tokens_details
    assert usage.accepted_prediction_tokens > 30 and usage.rejected_prediction_tokens == 0


def test_the_responses_api_takes_the_same_field(client, plain):
    r = client.post("/v1/responses", json={
        "input": "rewrite this", "max_output_tokens": 40, "temperature": 0,
        "speculative": LOOKUP, "prediction": {"type": "content", "content": plain}})
    assert r.status_code == 200, r.text
    out = r.json()["usage"]["output_tokens_details"]
    assert out["accepted_prediction_tokens"] > 0
    bad = client.post("/v1/responses", json={"input": "x", "prediction": {"type": "text"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prediction"


@pytest.mark.parametrize("prediction, words", [
    (5, "prediction must be {\"type\": \"content\""),
    ("", None),
    ({"type": "text", "content": "x"}, "prediction.type must be 'content', got 'text'"),
    ({"content": "x"}, "prediction.type must be 'content', got None"),
    ({"type": "content", "content": 7}, "prediction.content must be a string or a list of text"),
    ({"type": "content", "content": []}, "prediction.content must be a string or a list of text"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "prediction.content must be a string or a list of text"),
    ({"type": "content", "content": "x", "extra": 1}, "prediction takes type and content only"),
    ({"type": "content", "content": "y" * 2 * N_CTX}, "prediction is 2048 tokens"),
])
def test_a_bad_prediction_is_400_naming_it_in_one_line(client, prediction, words):
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4,
                                                  "prediction": prediction})
    if words is None:
        # A bare string is read as the prediction's content.
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prediction" and "\n" not in error["message"]
    assert error["message"].startswith(words) and len(error["message"]) < 200
