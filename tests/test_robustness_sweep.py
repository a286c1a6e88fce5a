"""Property-based robustness sweep on the fake backend (issue 21): random valid and invalid
settings and inputs, through the engine (`Pair.generate`) and through the command line
(`tandem generate`). Every case either generates with consistent statistics or ends with the
engine's own one-line error; nothing else may escape, and no decode may break llama.cpp's rules
(the fake turns those into AssertionErrors, where llama.cpp would abort the process).

The examples are derandomized, so every run tries the same ENGINE_CASES + CLI_CASES cases
(docs/RELIABILITY.md gives the count).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.cli import main as cli_main
from engine.llama import backend as llama
from engine.errors import TandemError
from engine.events import DoneEvent, RoundEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.control.registry import POLICIES
from engine.sampling import SamplingParams
from tests import tinygguf
from bench.fakes.backend import FakeBackend

ENGINE_CASES = 1500
CLI_CASES = 600
SWEEP = dict(derandomize=True, database=None, deadline=None, print_blob=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

EOG = 59
DRAFTERS = ("plain", "draft", "lookup", "hybrid")

# The fake's tokens print as a-z, and 60-63 as the two halves of "é" and "ü": stop strings from
# this alphabet span tokens, and those with é/ü span a character split across two tokens.
stop_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyzéü", min_size=0, max_size=4)
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e-310, 1e-300, 1e300, -1.0])
prompts = st.one_of(
    st.just(""), st.sampled_from([" ", "\n\t  ", "<|im_end|>", "<|im_start|>system\nhi<|im_end|>",
                                  "<s></s>[INST]", "\ufeffBOM", "é" * 7]),
    st.text(max_size=40),
    st.text(alphabet="ab ", min_size=200, max_size=2000),    # long, repetitive: lookup matches
    st.builds(lambda a, b: a + "\udcff" + b, st.text(max_size=5), st.text(max_size=5)),  # non-UTF-8
)


def one_line(exc: TandemError) -> None:
    event(f"error: {type(exc).__name__}: {' '.join(str(exc).split()[:3])}")
    message = str(exc)
    assert message.strip() and "\n" not in message, repr(message)


def run_one(pair: Pair, prompt, config: GenerationConfig, drafter: str, policy_name: str,
            raw: bool, close_after: int | None) -> None:
    """One generation; asserts its statistics agree with its events when it completes."""
    policy = pair.make_policy(policy_name, drafter, config.gamma) if drafter != "plain" else None
    events = pair.generate(prompt, config, drafter=drafter, raw=raw, policy=policy)
    tokens: list[int] = []
    texts: list[str] = []
    committed = 0
    done = None
    for i, ev in enumerate(events):
        if close_after is not None and i >= close_after:
            events.close()  # the app's stop button: the generator is closed mid-answer
            event("stopped mid-answer")
            return
        if isinstance(ev, TokenEvent):
            texts.append(ev.text)
            if ev.origin != "flush":
                tokens.append(ev.token)
        elif isinstance(ev, RoundEvent):
            committed += ev.round.committed
        elif isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    s = done.stats
    event(f"generated ({s.mode}, finish {s.finish_reason})")
    assert list(done.tokens) == tokens
    assert s.output_tokens == len(tokens) == committed == len(s.origins)
    assert s.output_tokens <= config.max_tokens
    assert s.prompt_tokens + s.output_tokens <= pair.n_ctx
    assert s.finish_reason in ("eos", "stop", "length")
    assert s.accepted_tokens <= s.drafted_tokens
    assert "".join(texts) == done.text
    done.text.encode("utf-8")  # decodable text: no lone surrogates
    if s.finish_reason == "stop":
        whole = b"".join(pair.target.backend.token_bytes(t) for t in tokens).decode("utf-8", "replace")
        assert any(x and x in whole for x in config.stop)
    for x in config.stop:
        if x:
            assert x not in done.text


def caches_consistent(pair: Pair) -> None:
    """Every session's token list is exactly what its backend's cache holds, in order."""
    assert pair.target.tokens == pair.target.backend.cache
    draft = pair.registry.get("draft")
    if draft is not None:
        assert draft.session.tokens == draft.session.backend.cache


# Each setting's valid range, and values outside it (or at its edges) to swap in for one of them.
VALID = dict(
    # Edges, and contexts long enough that most prompts in the fake's chat template fit.
    ctx=st.one_of(st.sampled_from([16, 17, 32, 64]), st.integers(40, 400), st.integers(120, 600)),
    batch=st.one_of(st.sampled_from([1, 2, 3, 4, 512]), st.integers(1, 64)),
    gamma=st.integers(0, 12), max_tokens=st.integers(1, 48),
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 2.0)), top_k=st.integers(0, 80),
    top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 0.5),
    seed=st.one_of(st.none(), st.integers(0, 2**70)),
    drafter=st.sampled_from(DRAFTERS), policy=st.sampled_from(POLICIES),
    p_min=st.floats(0.0, 0.9), chain_min=st.floats(0.0, 0.9))
INVALID = dict(
    ctx=st.sampled_from([1, 2, 3, 8]), batch=st.just(1), gamma=st.sampled_from([-2, -1, 33, 40]),
    max_tokens=st.sampled_from([-1, 0]),
    temperature=st.one_of(odd_floats, st.floats(-3, -1e-9)), top_k=st.integers(-3, -1),
    top_p=st.one_of(odd_floats, st.floats(1.0001, 2), st.just(0.0)),
    min_p=st.one_of(odd_floats, st.floats(1.0, 2)), seed=st.integers(-5, -1),
    drafter=st.sampled_from(["early-exit", "bogus"]), policy=st.just("bogus"),
    p_min=st.one_of(odd_floats, st.floats(1.0, 2)), chain_min=st.one_of(odd_floats, st.floats(1.0, 2)))


@st.composite
def engine_settings(draw) -> dict:
    """Valid settings, with (half the time) one of them replaced by an invalid or edge value."""
    values = {k: draw(v) for k, v in VALID.items()}
    broken = draw(st.sampled_from([None] * len(INVALID) + list(INVALID)))
    if broken is not None:
        values[broken] = draw(INVALID[broken])
        event(f"broken setting: {broken}")
    return values


plain_prompts = st.text(alphabet="abcdefgh éü\n", min_size=1, max_size=30)


@settings(max_examples=ENGINE_CASES, **SWEEP)
@given(case=engine_settings(), stops=st.lists(stop_text, max_size=3),
       prompt_list=st.lists(st.one_of(plain_prompts, plain_prompts, prompts), min_size=1, max_size=2),
       raw=st.booleans(), close_after=st.one_of(st.none(), st.none(), st.integers(0, 6)))
def test_engine_settings_and_inputs_never_escape(case, stops, prompt_list, raw, close_after):
    c = case
    target = FakeBackend(n_ctx=c["ctx"], n_batch=c["batch"], eog=EOG)
    draft = FakeBackend(n_ctx=c["ctx"], n_batch=c["batch"], eog=EOG, noise=1.0)
    try:
        pair = Pair(target, draft, p_min=c["p_min"], chain_min=c["chain_min"])
    except TandemError as exc:
        one_line(exc)
        return
    for k, prompt in enumerate(prompt_list):
        try:
            config = GenerationConfig(
                params=SamplingParams(temperature=c["temperature"], top_k=c["top_k"],
                                      top_p=c["top_p"], min_p=c["min_p"], seed=c["seed"]),
                gamma=c["gamma"], max_tokens=c["max_tokens"], stop=tuple(stops))
            # The first generation may be stopped early; the next must still be consistent.
            run_one(pair, prompt, config, c["drafter"], c["policy"], raw,
                    close_after if k == 0 else None)
        except TandemError as exc:
            one_line(exc)
        caches_consistent(pair)
    pair.close()


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    vocab = tinygguf.vocab(64)
    return (str(tinygguf.write(d / "target.gguf", tokens=vocab, n_ctx_train=1 << 20)),
            str(tinygguf.write(d / "draft.gguf", tokens=vocab, n_ctx_train=1 << 20)))


def fake_loader(config):
    # llama.cpp clamps the batch to the context; the fake keeps llama.cpp's limits.
    return FakeBackend(n_ctx=config.n_ctx, n_batch=min(config.n_batch, config.n_ctx), eog=EOG,
                       noise=0.0 if "target" in config.path else 1.0)


CLI_VALID = {
    "--ctx": st.one_of(st.sampled_from([16, 32, 64]), st.integers(60, 600)),
    "--batch": st.one_of(st.sampled_from([1, 2, 512]), st.integers(1, 80)),
    "--threads": st.sampled_from([1, 2, 512]), "--gpu-layers": st.sampled_from([-1, 0, 99]),
    "--gamma": st.integers(0, 12), "--max-tokens": st.integers(1, 40),
    "--temperature": st.one_of(st.just(0.0), st.floats(0.05, 2.0)), "--top-k": st.integers(0, 80),
    "--top-p": st.floats(0.05, 1.0), "--min-p": st.floats(0.0, 0.5),
    "--seed": st.integers(0, 2**70), "--drafter": st.sampled_from(DRAFTERS),
    "--policy": st.sampled_from(POLICIES), "--lookup-ngram": st.integers(1, 5),
    "--draft-chain-min": st.floats(0.0, 0.9),
}
CLI_INVALID = {
    "--ctx": st.sampled_from([0, -1, 15, 2**31, 2**40, 1 << 21]),
    "--batch": st.sampled_from([0, -5, 2**32]),
    "--threads": st.sampled_from([0, -1, 513, 10**6]), "--gpu-layers": st.sampled_from([-2, -10]),
    "--gamma": st.sampled_from([-1, 33]), "--max-tokens": st.sampled_from([-1, 0]),
    "--temperature": st.sampled_from(["nan", "inf", "-0.5", "1e-300", "abc"]),
    "--top-k": st.integers(-3, -1), "--top-p": st.sampled_from(["0", "1.5", "nan"]),
    "--min-p": st.sampled_from(["1", "2", "-0.1", "nan"]), "--seed": st.integers(-3, -1),
    "--drafter": st.just("bogus"), "--policy": st.just("bogus"),
    "--lookup-ngram": st.sampled_from([0, -1]), "--draft-chain-min": st.sampled_from(["1", "-1"]),
}


@st.composite
def cli_args(draw) -> list[str]:
    """Flags each given (a valid value) or left at their default, and half the time one flag
    given a value out of range or not a number."""
    chosen = {flag: draw(values) for flag, values in CLI_VALID.items() if draw(st.booleans())}
    broken = draw(st.sampled_from([None] * len(CLI_INVALID) + list(CLI_INVALID)))
    if broken is not None:
        chosen[broken] = draw(CLI_INVALID[broken])
    argv = [a for flag, value in chosen.items() for a in (flag, str(value))]
    for stop in draw(st.lists(stop_text, max_size=2)):
        argv += ["--stop", stop]
    return argv + draw(st.lists(st.sampled_from(["--raw", "--json"]), unique=True))


@settings(max_examples=CLI_CASES, **SWEEP)
@given(args=cli_args(), prompt=st.one_of(plain_prompts, plain_prompts, prompts),
       draft_none=st.booleans())
def test_cli_settings_and_inputs_end_in_an_answer_or_one_error_line(gguf_pair, args, prompt,
                                                                     draft_none):
    target, draft = gguf_pair
    argv = ["generate", "--prompt", prompt, "--target", target,
            "--draft", "none" if draft_none else draft, "--draft-quant", "off",
            *args]
    out, err = io.StringIO(), io.StringIO()
    # The CLI's load as it is (file, compatibility and budget checks on the tiny GGUFs), with
    # fake models in place of llama.cpp's.
    with mock.patch.object(llama, "load", fake_loader), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main(argv)
        except SystemExit as exc:  # argparse's own usage error (a value that is not a number)
            rc = exc.code
            assert rc == 2 and "error:" in err.getvalue()
            event("argparse usage error")
            return
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err.getvalue()
    if rc == 2:
        assert len(errors) == 1, err.getvalue()
        event(f"error line: {' '.join(errors[0].split()[1:4])}")
        return
    event("generated")
    assert rc == 0 and not errors, err.getvalue()
    if "--json" in argv:
        result = json.loads(out.getvalue())
        s = result["stats"]
        assert s["output_tokens"] == len(s["origins"]) and s["rounds"] == len(s["gammas"])
        ctx = int(argv[argv.index("--ctx") + 1]) if "--ctx" in argv else 4096
        assert s["prompt_tokens"] + s["output_tokens"] <= ctx
        result["text"].encode("utf-8")
