"""`tandem serve` as a real process on 127.0.0.1 with the embedded pair, driven by the openai
client: chat and text completions, streamed and not, per-request speculative settings, greedy
agreement with plain decoding, eight clients at once, a client that leaves mid-stream, and the
bad inputs. One server process serves the whole module; answers stay a few tokens long.

The whole module is `long` (scripts/test --all): the server's first answer pays the pair's load
and its cost calibration, and every drafter the per-request settings ask for costs another
(issue 43: 11 s on a 2-core CPU). The default suite holds the same API on the fake pair."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine.backend import ModelConfig
from bench.exactness.greedy import require_near_tie, text_divergence
from engine.llama.backend import LlamaBackend
from engine.session import Session
from tests.appserver import free_port, wait_up

# Long as a whole: the server's first answer pays the pair's load and its cost calibration
# (about 25 s on 2 cores). The default suite holds the same API on fakes (test_serve_api.py,
# test_serve_leave.py, test_serve_parallel.py, test_serve_structured.py) and a real app server
# (test_app_api.py).
pytestmark = [pytest.mark.real, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-tandem-test"
N_CTX = 512
MAX_QUEUE = 2
START_TIMEOUT_S = 300
CODE = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def server(embedded_paths):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--ctx", str(N_CTX), "--threads", "2", "--api-key", KEY, "--max-queue", str(MAX_QUEUE),
         "--target", str(embedded_paths[0]), "--draft", str(embedded_paths[1])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_up(proc, f"{url}/health", START_TIMEOUT_S)
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


def running(server: str) -> bool:
    return httpx.get(f"{server}/health", timeout=10).json()["queue"]["running"]


def test_chat_completion_whole_and_streamed(client):
    model = client.models.list().data[0].id
    assert model == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    whole = client.chat.completions.create(model=model, messages=CODE, max_tokens=8)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 8 and whole.usage.prompt_tokens > 10
    spec = whole.speculative
    assert spec["drafter"] == "hybrid" and spec["controller"]["policy"] == "adaptive"
    assert spec["target_calls"] == len(spec["controller"]["gammas"]) >= 1
    # Eight tokens end inside or just after the controller's plain opening, or in its choice.
    assert spec["controller"]["reason"].startswith(("plain", "gamma", "probe"))
    assert spec["tokens_per_s"] > 0 and spec["ttft_ms"] > 0

    chunks = list(client.chat.completions.create(model=model, messages=CODE, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 2 and "".join(pieces)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].speculative["drafter"] == "hybrid"


def test_text_completion(client):
    out = client.completions.create(model="qwen2.5-coder-1.5b-instruct-q4_k_m",
                                    prompt="def add(a, b):\n", max_tokens=6)
    assert out.choices[0].text and out.usage.completion_tokens <= 6
    # Raw: no chat template (its system prompt alone is over 20 tokens).
    assert out.usage.prompt_tokens < 10


def test_per_request_settings_are_honoured_and_greedy_matches_plain(client, embedded_paths):
    def complete(spec: dict):
        return client.completions.create(model="qwen2.5-coder-1.5b-instruct-q4_k_m",
                                         prompt=PROMPT, max_tokens=10,
                                         extra_body={"speculative": spec, "top_k": 1})
    plain = complete({"drafter": "plain"})
    assert plain.speculative["mode"] == "plain" and plain.speculative["drafted_tokens"] == 0
    assert plain.speculative["target_calls"] == plain.usage.completion_tokens
    # Hybrid is calibrated already (the chat test's default); every drafter costs a calibration.
    draft = complete({"drafter": "hybrid", "policy": "fixed", "gamma": 2})
    s = draft.speculative
    assert (s["mode"], s["drafter"], s["controller"]["policy"], s["controller"]["max_gamma"]) == \
        ("speculative", "hybrid", "fixed", 2)
    assert set(s["controller"]["gammas"][:-1]) <= {2} and s["drafted_tokens"] > 0
    assert s["target_calls"] < draft.usage.completion_tokens  # code: the draft is mostly right
    lookup = complete({"drafter": "lookup", "policy": "heuristic", "gamma": 3})
    assert (lookup.speculative["drafter"], lookup.speculative["controller"]["policy"]) == \
        ("lookup", "heuristic")
    # Greedy (top-k 1) speculation gives the plain answer, except where batch numerics flip a
    # near-tie (docs/EXACTNESS.md): then the target's own top two were that close.
    differ = [a.choices[0].text for a in (draft, lookup)
              if a.choices[0].text != plain.choices[0].text]
    if not differ:
        return
    backend = LlamaBackend(ModelConfig(str(embedded_paths[0]), n_ctx=N_CTX, n_threads=2))
    try:
        target = Session(backend)
        prompt = backend.tokenize(PROMPT, add_special=True, parse_special=True)
        for text in differ:
            require_near_tie(text_divergence(target, prompt, plain.choices[0].text, text))
    finally:
        backend.close()


def test_eight_clients_at_once_get_an_answer_or_a_503(server, client):
    results: list[object] = [None] * 8
    start = threading.Barrier(8)

    def ask(i: int) -> None:
        start.wait()
        try:
            results[i] = client.chat.completions.create(
                model="qwen2.5-coder-1.5b-instruct-q4_k_m", max_tokens=4,
                messages=[{"role": "user", "content": f"Say a number above {i}."}])
        except openai.APIStatusError as exc:
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    answers = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(answers) + len(refused) == 8, results
    for r in answers:
        assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    for r in refused:
        assert r.status_code == 503 and int(r.response.headers["retry-after"]) >= 1
    # How many are refused depends on how fast the pair answers against how fast the clients
    # arrive (a GPU may answer them all); that a full queue is a 503 is counted on a fake pair
    # (tests/test_serve_api.py). Here: the first to arrive is answered, none is lost.
    assert len(answers) >= 1
    assert httpx.get(f"{server}/health", timeout=10).json()["status"] == "ok"


def test_a_client_that_leaves_mid_stream_frees_the_pair(server, client):
    stream = client.chat.completions.create(
        model="qwen2.5-coder-1.5b-instruct-q4_k_m", max_tokens=400, stream=True,
        messages=[{"role": "user", "content": "Write a long story about a river."}])
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 3:
                break
    assert running(server)
    stream.close()
    # The pair is freed (within a round: counted on a fake pair in tests/test_serve_leave.py;
    # here, without a time bound, that it is freed at all and serves the next request). The
    # bound only guards a hang.
    for _ in range(3000):
        if not running(server):
            break
        time.sleep(0.2)
    assert not running(server), "the generation went on after the client left"
    answer = client.chat.completions.create(model="qwen2.5-coder-1.5b-instruct-q4_k_m",
                                            messages=CODE, max_tokens=3)
    assert answer.choices[0].message.content


def test_a_client_that_gives_up_on_a_whole_answer_frees_the_pair(server):
    body = {"messages": [{"role": "user", "content": "Write a long story about a lake."}],
            "max_tokens": 400, "speculative": {"drafter": "plain"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/chat/completions", json=body, timeout=3,
                   headers={"Authorization": f"Bearer {KEY}"})
    # The next request is served (within a round of the client leaving: counted on a fake pair
    # in tests/test_serve_leave.py, not timed here).
    short = httpx.post(f"{server}/v1/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={**body, "max_tokens": 2})
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("name, request_kwargs, status", [
    ("malformed JSON", {"content": b"{not json"}, 400),
    ("unknown role", {"json": {"messages": [{"role": "bot", "content": "hi"}]}}, 400),
    ("prompt longer than the context", {"json": {"messages": [{"role": "user", "content": "word " * N_CTX}]}}, 413),
    ("bad sampling value", {"json": {"messages": CODE, "top_p": 1.5}}, 400),
    ("unsupported field", {"json": {"messages": CODE, "logit_bias": {"1": 2}}}, 400),
    ("missing key", {"json": {"messages": CODE}, "headers": {"Authorization": ""}}, 401),
    ("wrong key", {"json": {"messages": CODE}, "headers": {"Authorization": "Bearer sk-wrong"}}, 401),
])
def test_bad_input_gets_an_openai_error(server, name, request_kwargs, status):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
               **request_kwargs.pop("headers", {})}
    r = httpx.post(f"{server}/v1/chat/completions", headers=headers, timeout=60, **request_kwargs)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert httpx.get(f"{server}/health", timeout=10).json()["status"] == "ok"


def test_a_tool_call_round_trip(client):
    """The model's own template shows the tools (Qwen2.5's reads `tools`), the grammar holds its
    <tool_call> syntax, the call comes back streamed as OpenAI's deltas, and the tool's result
    sent back gets a text answer. `required` with one call (under `auto` this coder model
    answers with a fenced JSON block, read as its call too: tests/test_clients_real.py)."""
    model = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string"}}}}}]
    messages: list = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    calls: dict = {}
    finish = None
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                tool_choice="required", parallel_tool_calls=False,
                                                max_tokens=40, temperature=0, stream=True):
        if chunk.choices:
            finish = chunk.choices[0].finish_reason or finish
            for delta in chunk.choices[0].delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": delta.id, "arguments": ""})
                call["name"] = delta.function.name or call.get("name")
                call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0], calls
    call = calls[0]
    assert call["name"] == "get_weather" and "paris" in json.loads(call["arguments"])["city"].lower()
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call["id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees, sunny"}]
    final = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                           max_tokens=12, temperature=0)
    answer = final.choices[0].message
    assert answer.tool_calls is None and answer.content, answer
