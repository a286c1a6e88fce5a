"""Request bodies the API refuses, and the settings it takes from good ones (no model needed).

Every refusal is a 400 naming the field, so a client learns which of its options had no effect.
"""
from __future__ import annotations

import pytest

from app.runtime.request import Offer
from app.serve.errors import BadRequestError
from app.serve.parsing import parse_chat, parse_completion, parse_json

OFFER = Offer(("plain", "draft", "hybrid", "lookup"), "hybrid")
HI = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat({"messages": HI, **fields}, OFFER)


def refused(call, *args, **fields) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        call(*args, **fields)
    return info.value


@pytest.mark.parametrize("fields, param", [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"tools": []}, "tools"),
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": 1.0}, "min_p"),
    ({"seed": "x"}, "seed"),
    ({"seed": -2}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"n": 2}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stop": 3}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"chunk_size": 2}}, "stream_options.chunk_size"),
    ({"model": 7}, "model"),
    ({"speculative": "fast"}, "speculative"),
    ({"speculative": {"drafter": "oracle"}}, "speculative.drafter"),
    ({"speculative": {"policy": "greedy"}}, "speculative.policy"),
    ({"speculative": {"gamma": -1}}, "speculative.gamma"),
    ({"speculative": {"gamma": 33}}, "speculative.gamma"),
    ({"speculative": {"max_gamma": 4}}, "speculative.max_gamma"),
    ({"speculative": {"drafter": "plain", "gamma": 4}}, "speculative.gamma"),
    ({"speculative": {"drafter": "plain", "policy": "fixed"}}, "speculative.policy"),
])
def test_a_bad_field_is_refused_by_name(fields, param):
    error = refused(chat, **fields)
    assert error.param == param and error.status == 400
    assert "\n" not in str(error)


@pytest.mark.parametrize("messages, param", [
    (None, "messages"),
    ([], "messages"),
    ("hi", "messages"),
    (["hi"], "messages[0]"),
    ([{"role": "developer", "content": "x"}], "messages[0].role"),
    ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
    ([{"role": "user", "content": "x", "tool_call_id": "c1"}], "messages[0].tool_call_id"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "[1]"}}]}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x", "name": 7}], "messages[0].name"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]"),
])
def test_bad_messages_are_refused_by_name(messages, param):
    error = refused(parse_chat, {"messages": messages}, OFFER)
    assert error.param == param


@pytest.mark.parametrize("prompt", [None, "", 3, ["a", "b"], [1, 2, 3]])
def test_bad_prompts_are_refused(prompt):
    assert refused(parse_completion, {"prompt": prompt}, OFFER).param == "prompt"


def test_a_completion_may_not_carry_messages():
    error = refused(parse_completion, {"prompt": "x", "messages": HI}, OFFER)
    assert error.param == "messages"


@pytest.mark.parametrize("body", [b"{bad", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_refused(body):
    assert refused(parse_json, body).code == "invalid_json"


def test_every_supported_field_reaches_the_request_spec():
    req = chat(model="m", max_tokens=7, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=3,
               stop=["\n\n", "END"], stream=True, stream_options={"include_usage": True}, n=1,
               speculative={"drafter": "lookup", "policy": "heuristic", "gamma": 5})
    p = req.spec.sampling
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.7, 0.9, 40, 0.05, 3)
    assert req.spec.max_tokens == 7 and req.spec.stop == ("\n\n", "END")
    assert req.spec.gamma == 5 and (req.spec.drafter, req.spec.policy) == ("lookup", "heuristic")
    assert req.stream and req.include_usage and req.model == "m" and not req.spec.raw


def test_defaults_and_plain_decoding():
    req = chat()
    assert (req.spec.drafter, req.spec.policy, req.spec.gamma) == ("hybrid", "adaptive", 8)
    assert req.spec.sampling.greedy and req.spec.max_tokens == 256 and not req.stream
    plain = chat(speculative={"drafter": "plain"}, max_completion_tokens=5, stop="x")
    assert (plain.spec.drafter, plain.spec.policy, plain.spec.gamma) == ("plain", None, 0)
    # "none", plain decoding's old name, still means it; so does gamma 0, with any drafter.
    assert chat(speculative={"drafter": "none"}).spec.drafter == "plain"
    assert chat(speculative={"drafter": "lookup", "gamma": 0}).spec.drafter == "plain"
    assert plain.spec.max_tokens == 5 and plain.spec.stop == ("x",)
    # Seed -1 is a random seed, as in llama.cpp.
    assert chat(seed=-1).spec.sampling.seed is None


def test_text_parts_are_joined_and_a_completion_is_raw():
    req = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                  {"type": "text", "text": "b"}]}]},
                     OFFER)
    assert req.spec.prompt == ({"role": "user", "content": "ab"},)
    done = parse_completion({"prompt": ["def f():"], "temperature": None}, OFFER)
    assert done.spec.prompt == "def f():" and done.spec.raw and done.spec.sampling.temperature == 0.0
