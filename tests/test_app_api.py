"""The launched app through gradio_client on a real small model (the 0.5B embedded draft serves as
both target and draft): chat streams and returns stats, side by side returns both runs, the models
endpoints list the catalog and refuse an incompatible pair, and two users are queued, not crashed."""
from __future__ import annotations

import threading

import pytest
from gradio_client import Client

from app.runtime.holder import PairHolder
from tests import appserver, tinygguf

pytestmark = pytest.mark.real

# drafter, policy, gamma, temperature, top-k, top-p, min-p, seed, max tokens
GREEDY = ("draft", "fixed", 3, 0.0, 0, 1.0, 0.0, -1, 12)


@pytest.fixture(scope="module")
def app_url():
    holder = PairHolder()
    appserver.load_small_pair(holder)
    with appserver.serve(holder) as url:
        yield url
    holder.close()


@pytest.fixture
def client(app_url):
    return Client(app_url, verbose=False)


def assistant_text(history: list[dict]) -> str:
    content = history[-1]["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_chat_streams_text_and_returns_stats(client):
    settings = ("draft", "fixed", 2, 0.0, 0, 1.0, 0.0, -1, 16)
    job = client.submit("Write a Python function that adds two numbers.", [], *settings, api_name="/chat")
    outputs = list(job)
    history, tokens_html, panel, stats, box, *_ = job.result()
    texts = [assistant_text(o[0]) for o in outputs if o[0]]
    assert box == {"__type__": "update"} and history[-2]["role"] == "user" and history[-1]["role"] == "assistant"
    assert stats["output_tokens"] > 0 and stats["drafted_tokens"] > 0 and stats["mode"] == "speculative"
    assert assistant_text(history) == stats["text"] and stats["text"]
    # Streamed: the page saw the answer grow before it was complete.
    assert any(0 < len(t) < len(stats["text"]) for t in texts), texts
    assert 'data-state="done"' in panel and "acceptance by draft position" in panel
    assert "tok-draft" in tokens_html

    second = client.predict("Now in C.", history, *GREEDY, api_name="/chat")
    assert second[3]["prompt_tokens"] > stats["prompt_tokens"] + stats["output_tokens"]
    assert len(second[0]) == 4


def test_plain_decoding_from_the_chat(client):
    history, _, panel, stats, _, *_ = client.predict("Say hi.", [], "plain", *GREEDY[1:], api_name="/chat")
    assert stats["mode"] == "plain" and stats["drafted_tokens"] == 0 and stats["output_tokens"] > 0
    assert "n/a" in panel


def test_side_by_side_returns_both_runs(client):
    left, right, summary, results = client.predict("def add(a, b):", 1, *GREEDY, api_name="/compare")
    (base,), (spec,) = results["plain"], results["speculative"]
    assert base["mode"] == "plain" and spec["mode"] == "speculative"
    assert base["output_tokens"] > 0 and spec["output_tokens"] > 0
    assert results["greedy"] is True and results["identical"] in (True, False)
    if results["identical"]:
        assert base["text"] == spec["text"] and results["first_difference"] is None
    else:
        assert isinstance(results["first_difference"], int) and "first differ at output token" in summary
    assert results["speedup_tokens_per_s"] > 0 and "speedup" in summary
    assert "plain decoding" in left and "speculative" in right


def test_two_users_are_queued_not_crashed(app_url):
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def user(i: int) -> None:
        try:
            out = Client(app_url, verbose=False).predict(f"Count to {i + 3}.", [], *GREEDY, api_name="/chat")
            results[i] = out[3]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == [0, 1] and all(r["output_tokens"] > 0 for r in results.values())


def test_catalog_endpoint_lists_the_pairs(client):
    table = client.predict(api_name="/catalog")
    ids = [row[0] for row in table["data"]]
    from models.catalog import load_catalog
    assert ids == [p.id for p in load_catalog()]
    assert table["data"][0][4] == "yes"  # the embedded pair is on disk


def test_models_endpoints_refuse_an_incompatible_pair(client, tmp_path):
    target = tinygguf.write(tmp_path / "target.gguf", tokens=tinygguf.vocab(400))
    draft = tinygguf.write(tmp_path / "draft.gguf", tokens=tinygguf.vocab(200))
    report, verdict = client.predict("", str(target), "", str(draft), 1024, api_name="/check")
    assert verdict["compatible"] is False and verdict["ok"] is False
    assert "incompatible" in report and "differ by 200 tokens" in report and "same model family" in report

    note = client.predict("", str(target), "", str(draft), 1024, "", 1.0, "", 1.0,
                          api_name="/load_pair")
    assert "Refused" in note and "differ by 200 tokens" in note
    # The pair that was loaded stays in service.
    assert client.predict("Hi", [], *GREEDY, api_name="/chat")[3]["output_tokens"] > 0


def test_models_check_on_the_small_model_pair(client):
    path = str(appserver.small_model())
    report, verdict = client.predict("", path, "", path, 1024, api_name="/check")
    assert verdict == {"ok": True, "fits": True, "compatible": True, "missing": []}
    assert "Memory: fits" in report and "Compatibility: compatible" in report and "verdict: fits" in report
