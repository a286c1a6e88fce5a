"""`tandem ui --api`: the API beside the page on one server, over a fake pair, sharing the
page's generation queue; and the command-line errors of `serve` and `ui --api`."""
from __future__ import annotations

import httpx
import pytest
from gradio_client import Client

from app.cli import main
from app.runtime.queue import GenerationQueue
from app.serve.routes import api_router
from app.runtime.holder import PairHolder
from tests import appserver
from tests.serve_fakes import MODEL, fake_pair

# drafter, policy, gamma, temperature, top-k, top-p, min-p, seed, max tokens
GREEDY = ("draft", "fixed", 3, 0.0, 0, 1.0, 0.0, -1, 8)


@pytest.fixture(scope="module")
def app_with_api():
    holder = PairHolder(fake_pair(), queue=GenerationQueue(max_waiting=0))
    with appserver.serve(holder, api_router(holder, holder.queue)) as url:
        yield url.rstrip("/"), holder


def test_the_page_and_the_api_share_one_server(app_with_api):
    url, _ = app_with_api
    assert httpx.get(url, timeout=30).status_code == 200  # the Gradio page
    assert httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"] == MODEL
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
    stream = httpx.post(f"{url}/v1/completions", timeout=60,
                        json={"prompt": "ab", "max_tokens": 4, "stream": True})
    assert stream.text.rstrip().endswith("data: [DONE]") and '"speculative"' in stream.text
    _, _, _, stats, _, *_ = Client(url, verbose=False).predict("hi", [], *GREEDY, api_name="/chat")
    assert stats["output_tokens"] == 8


def test_the_page_and_the_api_take_turns_from_one_queue(app_with_api):
    url, holder = app_with_api
    ticket = holder.queue.join()  # the page's chat is generating
    try:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        # And the other way round: the page waits in the same queue, full here.
        with pytest.raises(Exception, match="busy"):
            Client(url, verbose=False).predict("hi", [], *GREEDY, api_name="/chat")
    finally:
        holder.queue.leave(ticket)
    assert httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"prompt": "ab", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("argv, words", [
    (["ui", "--api-key", "k"], "add --api"),
    (["ui", "--api-key-file", "/nonexistent/key"], "add --api"),
    (["serve", "--api-key", "k", "--api-key-file", "/nonexistent/key"], "not both"),
    (["serve", "--api-key-file", "/nonexistent/key"], "cannot read --api-key-file"),
    (["serve", "--allowed-hosts", "http://tandem.lan"], "--allowed-hosts"),
    (["serve", "--allowed-origins", "tandem.lan"], "--allowed-origins"),
    (["serve", "--port", "0"], "--port"),
    (["serve", "--max-queue", "-1"], "--max-queue"),
    (["serve", "--target", "/nonexistent/model.gguf", "--draft", "none"], "model.gguf"),
])
def test_command_line_errors_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err
