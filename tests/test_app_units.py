"""The app's pieces without a real model: formatting, settings, the pair holder, chat stop and
the side-by-side bookkeeping, over the fake backend and tiny GGUF files."""
from __future__ import annotations

import html

import gradio as gr
import pytest

from app.ui import chat, compare, controls, metrics, status_banner
from app.ui.chat import plain_text, respond, to_messages
from app.runtime.holder import ERROR, READY, NotReadyError, PairHolder
from app.runtime.request import Offer, RunSpec
from app.ui.state import StopFlags
from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.events import FORCED
from engine.pair import Pair
from engine.stats import GenerationStats
from loading.options import LoadOptions
from tests import tinygguf
from bench.fakes.backend import FakeBackend

FAKE_OPTS = LoadOptions(check_budget=False, draft_quant="off")
# drafter, policy, gamma, temperature, top-k, top-p, min-p, seed, max tokens
GREEDY_FAKE = ("draft", "fixed", 2, 0.0, 0, 1.0, 0.0, -1, 8)


# What the fake pair offers a request.
OFFER = Offer(("plain", "draft", "hybrid", "lookup", "suffix"), "hybrid")


def settings(**kw) -> RunSpec:
    values = dict(drafter="draft", policy="fixed", gamma=4, temperature=0.0, top_k=0, top_p=1.0,
                  min_p=0.0, seed=-1, max_tokens=24)
    values.update(kw)
    return controls.spec(OFFER, **values)


def fake_holder(noise: float = 0.5) -> PairHolder:
    return PairHolder(Pair(FakeBackend(), FakeBackend(noise=noise)))


@pytest.mark.parametrize("a,b,expected", [((1, 2, 3), (1, 2, 3), None), ((1, 2, 3), (1, 5, 3), 1),
                                          ((1, 2), (1, 2, 3), 2), ((), (), None), ((4,), (5,), 0)])
def test_first_difference(a, b, expected):
    assert compare.first_difference(a, b) == expected


def test_spread_median_and_range():
    s = compare.Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high) == (2.5, 1.0, 10.0)
    assert s.show("{:.1f}") == "2.5 (1.0–10.0)"
    assert compare.Spread.of([2.0]).show("{:.1f}") == "2.0"


def test_token_view_colours_each_origin_and_escapes_text():
    pieces = [metrics.Piece("def", "draft"), metrics.Piece(" <f>", "correction"), metrics.Piece("(", "bonus"),
              metrics.Piece("x", "plain"), metrics.Piece('"', FORCED)]
    out = metrics.token_view(pieces)
    for origin, color in metrics.ORIGIN_COLORS.items():
        assert f'class="tok-{origin}"' in out and color in out
    assert "&lt;f&gt;" in out and "<f>" not in out
    assert "1 draft · 1 correction · 1 bonus · 1 plain · 1 forced" in out
    assert all(html.escape(label) in out for label in metrics.ORIGIN_LABELS.values())


def test_live_panel_and_chart():
    s = GenerationStats(mode="speculative", drafter="draft", output_tokens=9, drafted_tokens=8,
                        accepted_tokens=6, rounds=2, target_calls=2, draft_time_ms=80.0, verify_time_ms=120.0,
                        ttft_ms=55.0, drafted_at=[2, 2, 2, 2], accepted_at=[2, 2, 1, 1])
    out = metrics.live_panel(s)
    assert 'data-state="running"' in out and 'data-tokens="9"' in out
    assert "75%" in out and "3.00" in out and "45.00" in out  # 9 tokens over 200 ms of rounds
    assert out.count("% of 2") == 4 and "50% of 2" in out
    base = metrics.live_panel(GenerationStats(mode="plain", output_tokens=3, rounds=3, target_calls=3,
                                              verify_time_ms=300.0), done=True)
    assert "n/a" in base and "acceptance by draft position" not in base and 'data-state="done"' in base
    assert 'data-state="idle"' in metrics.live_panel(None)


def test_the_pages_values_make_the_request_spec():
    s = settings(seed=-1)
    assert s.sampling.seed is None and s.seed == -1 and s.config.gamma == 4
    assert s.plain().config.gamma == 0 and s.plain().make_policy() is None
    assert settings(seed=7).sampling.seed == 7 and settings(seed="").sampling.seed is None
    assert s.make_policy().next_gamma().gamma == 4
    assert settings(policy="heuristic").make_policy().name == "heuristic"
    assert set(controls.policy_names()) >= {"fixed", "heuristic", "adaptive"}
    # The policy and gamma controls steer a drafter; plain decoding ignores them, and gamma 0
    # is plain decoding whatever the drafter.
    assert (settings(drafter="plain", gamma=8).drafter, settings(drafter="plain").gamma) == ("plain", 0)
    assert (settings(gamma=0).drafter, settings(gamma=0).policy) == ("plain", None)


@pytest.mark.parametrize("values, message", [
    ({"seed": "abc"}, "seed must be an integer, got 'abc'"),
    ({"seed": -2}, "seed must be >= -1 (-1 is random), got -2"),
    ({"top_p": 0.0}, "top_p must be in (0, 1] (1 is off), got 0"),
    ({"gamma": 99}, "gamma must be between 0 and 32 (0 is plain decoding), got 99"),
    ({"policy": "nope"}, "policy must be one of adaptive, fixed, heuristic, plain, got 'nope'"),
    ({"drafter": "nope"}, "drafter must be one of plain, draft, hybrid, lookup, suffix, got 'nope'"),
])
def test_a_bad_page_value_is_the_tables_one_line_message(values, message):
    with pytest.raises(SettingsError) as info:
        settings(**values)
    assert str(info.value) == message


@pytest.mark.parametrize("drafter,policy", [("lookup", "heuristic"), ("hybrid", "fixed"), ("draft", "adaptive")])
def test_chat_with_each_engine_drafter_and_policy(drafter, policy):
    holder, flags = fake_holder(), StopFlags()
    assert drafter in holder.pair.drafters
    *_, (history, _, panel, stats, _, _) = respond(holder, flags, "s", "hello hello hello", [],
                                                settings(drafter=drafter, policy=policy, max_tokens=12))
    assert stats["output_tokens"] == 12 and stats["mode"] == "speculative" and 'data-state="done"' in panel


def test_chat_messages_from_chatbot_history():
    history = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
               {"role": "assistant", "content": "hello", "metadata": None}]
    assert to_messages(history) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert plain_text(None) == "" and plain_text([{"text": "a"}, "b"]) == "ab"


def test_holder_reports_missing_model_and_refuses_generation(tmp_path):
    holder = PairHolder()
    error = holder.load(ModelConfig(str(tmp_path / "missing.gguf")), None, FAKE_OPTS)
    assert holder.status.state == ERROR and "missing.gguf" in error
    with pytest.raises(NotReadyError, match="no model is loaded: .*missing.gguf"):
        holder.pair
    banner = status_banner(holder)
    assert 'data-state="error"' in banner and "missing.gguf" in banner and "Models tab" in banner


def test_holder_loads_stepwise_and_keeps_old_pair_on_incompatible(tmp_path):
    t = tinygguf.write(tmp_path / "t.gguf", tokens=tinygguf.vocab(400))
    d = tinygguf.write(tmp_path / "d.gguf", tokens=tinygguf.vocab(400))
    bad = tinygguf.write(tmp_path / "bad.gguf", tokens=tinygguf.vocab(400), add_bos=True)
    seen: list[str] = []
    holder = PairHolder()

    def loader(config: ModelConfig) -> FakeBackend:
        seen.append(holder.status.message)
        return FakeBackend(seed=len(seen))

    holder._loader = loader
    assert holder.load(ModelConfig(str(t)), ModelConfig(str(d)), FAKE_OPTS) is None
    assert holder.status.state == READY and seen == ["loading target t.gguf", "loading draft d.gguf"]
    first = holder.pair
    error = holder.load(ModelConfig(str(t)), ModelConfig(str(bad)), FAKE_OPTS)
    assert "incompatible" in error and "add-BOS flag differs" in error
    assert (holder.status.state == READY and holder.pair is first
            and "add-BOS flag differs" in status_banner(holder))


def test_holder_says_when_the_draft_runs_as_its_requantized_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    t = tinygguf.write(tmp_path / "t.gguf", n_embd=64)
    d = tinygguf.write(tmp_path / "d.gguf", n_embd=64)
    holder = PairHolder()
    holder._loader = lambda config: FakeBackend()
    assert holder.load(ModelConfig(str(t)), ModelConfig(str(d)),
                       LoadOptions(check_budget=False, draft_quant="q4_0")) is None
    assert holder.status.state == READY
    assert "; draft runs as d.q4_0." in holder.status.message
    assert holder.load(ModelConfig(str(t)), ModelConfig(str(d)), FAKE_OPTS) is None
    assert "draft runs as" not in holder.status.message


def test_stop_ends_generation_and_frees_the_lock(monkeypatch):
    monkeypatch.setattr(chat, "MIN_REFRESH_S", 0.0)
    holder, flags = fake_holder(), StopFlags()
    stream = respond(holder, flags, "s1", "hello", [], settings(max_tokens=200, gamma=2))
    next(stream)
    next(stream)
    flags.stop("s1")
    outs = list(stream)
    history, _, panel, stats, _, _ = outs[-1]
    assert "stopped" in panel and stats["finish_reason"] == "stopped" and stats["output_tokens"] < 200
    assert history[-1]["content"] == stats["text"] and history[-1]["content"]
    # The stopped answer gave its turn back.
    assert holder.queue.snapshot() == {"running": 0, "waiting": 0,
                                       "max_waiting": holder.queue.max_waiting, "parallel": 1}


def test_chat_refuses_empty_message_and_a_drafter_the_pair_lacks():
    holder, flags = fake_holder(), StopFlags()
    with pytest.raises(gr.Error, match="type a message"):
        next(respond(holder, flags, "s", "  ", [], settings()))
    with pytest.raises(gr.Error, match="unknown drafter 'early-exit'"):
        list(respond(holder, flags, "s", "hi", [],
                     controls.spec(Offer(("early-exit",), "early-exit"), "early-exit", "fixed", 4,
                                   0.0, 0, 1.0, 0.0, -1, 8)))


def test_compare_greedy_fake_pair_is_identical_and_summarised():
    holder, flags = fake_holder(noise=1.0), StopFlags()
    outs = list(compare.compare(holder, flags, "s", "hello", settings(max_tokens=20), repeats=2))
    left, right, summary, results = outs[-1]
    assert len(results["plain"]) == 2 and len(results["speculative"]) == 2
    assert results["identical"] is True and results["first_difference"] is None
    assert {r["mode"] for r in results["plain"]} == {"plain"}
    assert {r["mode"] for r in results["speculative"]} == {"speculative"}
    assert results["plain"][0]["text"] == results["speculative"][0]["text"]
    assert "speedup" in summary and "over 2 repeat(s)" in summary and "identical" in summary
    assert "tok-draft" in right and "tok-plain" in left


def test_compare_sampling_says_outputs_are_not_expected_to_match():
    holder, flags = fake_holder(), StopFlags()
    *_, (_, _, summary, results) = compare.compare(holder, flags, "s", "hi", settings(temperature=0.8, seed=3,
                                                                                      max_tokens=10), 1)
    assert results["identical"] is None and "not expected to match" in summary


def test_pair_that_does_not_fit_is_refused_with_the_breakdown(tmp_path):
    huge = (1 << 31) - 1  # the largest context llama.cpp's 32-bit fields can take
    # Trained for that long too: the refusal under test is the memory budget's.
    t = tinygguf.write(tmp_path / "t.gguf", tokens=tinygguf.vocab(400), n_ctx_train=huge)
    d = tinygguf.write(tmp_path / "d.gguf", tokens=tinygguf.vocab(400), n_ctx_train=huge)
    holder = PairHolder(loader=lambda config: FakeBackend())
    error = holder.load(ModelConfig(str(t), n_ctx=huge), ModelConfig(str(d), n_ctx=huge))
    assert holder.status.state == ERROR and "GiB RAM" in error and "KV" in error
    assert "GiB RAM" in status_banner(holder)


def test_failed_startup_shows_the_reason_in_the_page(tmp_path):
    from gradio_client import Client

    from tests import appserver

    holder = PairHolder()
    holder.prepare_async(lambda: (ModelConfig(str(tmp_path / "gone.gguf")), None))
    holder.wait(30)
    with appserver.serve(holder) as url:
        client = Client(url, verbose=False)
        banner, *_ = client.predict(api_name="/status")
        assert 'data-state="error"' in banner and "gone.gguf" in banner
        with pytest.raises(Exception, match="no model is loaded: .*gone.gguf"):
            client.predict("hi", [], *GREEDY_FAKE, api_name="/chat")
        table = client.predict(api_name="/catalog")
        assert table["data"], "the models tab still works without a loaded pair"


def test_a_prompt_the_context_cannot_hold_is_a_page_error_and_the_app_goes_on():
    # Issue 21: what aborted the CLI in llama.cpp would have taken the server down with it.
    holder = PairHolder(Pair(FakeBackend(n_ctx=64, n_batch=16), FakeBackend(noise=0.5, n_ctx=64,
                                                                          n_batch=16)))
    flags = StopFlags()
    with pytest.raises(gr.Error, match="the newest message alone needs .* tokens and the context "
                                       "has room for 40 besides the answer"):
        list(respond(holder, flags, "s", "a long message " * 20, [], settings()))
    *_, (history, _, _, stats, _, _) = respond(holder, flags, "s", "short", [], settings())
    assert stats["output_tokens"] > 0 and history[-1]["content"] == stats["text"]
    assert stats["prompt_tokens"] + stats["output_tokens"] <= 64
