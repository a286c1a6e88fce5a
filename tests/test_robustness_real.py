"""The robustness sweep's boundary cases on the real pair (issue 21): each a `tandem generate`
subprocess that must exit 0 with an answer or 2 with one `error:` line, never by a signal.

Before the fix, `--ctx 16` handed llama.cpp a 40-token batch where its context took 16 and the
process died in GGML_ASSERT (exit 134).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ESSAY = "Write a long essay about the history of computing in Europe"
CODE = "def add(a, b):"


def tandem(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "generate", "--threads", "2", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    # A negative return code is a signal (SIGABRT from a GGML_ASSERT was -6).
    assert proc.returncode in (0, 2), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == (1 if proc.returncode == 2 else 0), proc.stderr[-2000:]
    return proc


@pytest.mark.real
# Long: test_robustness_sweep.py runs the same CLI at --ctx 16 on fakes in the default suite.
@pytest.mark.long
def test_ctx_16_with_a_prompt_that_cannot_fit_is_one_error_line(embedded_paths):
    proc = tandem("--ctx", "16", "--prompt", ESSAY)
    assert proc.returncode == 2
    assert "the prompt needs" in proc.stderr and "the context holds 16; raise --ctx" in proc.stderr


@pytest.mark.real
@pytest.mark.long
def test_ctx_16_answer_runs_into_the_context_end_mid_round(embedded_paths):
    # Fixed gamma 4 drafts past the 10 positions left after the 6-token prompt unless the round
    # is cut to the room that is left.
    proc = tandem("--ctx", "16", "--raw", "--prompt", CODE, "--drafter", "draft", "--policy",
                  "fixed", "--gamma", "4", "--max-tokens", "16", "--json")
    assert proc.returncode == 0
    s = json.loads(proc.stdout)["stats"]
    assert s["finish_reason"] == "length" and s["prompt_tokens"] + s["output_tokens"] == 16
    assert s["drafted_tokens"] > 0


@pytest.mark.long
@pytest.mark.real
def test_ctx_32_with_a_batch_smaller_than_the_prompt(embedded_paths):
    proc = tandem("--ctx", "32", "--batch", "3", "--raw", "--prompt",
                  "def fibonacci(n):\n    # return the n-th Fibonacci number\n", "--draft",
                  "none", "--max-tokens", "6", "--json")
    assert proc.returncode == 0
    s = json.loads(proc.stdout)["stats"]
    assert s["prompt_tokens"] > 3 and 1 <= s["output_tokens"] <= 6


@pytest.mark.long
@pytest.mark.real
def test_ctx_64_stop_string_across_rounds(embedded_paths):
    # Rounds commit at most 3 tokens at gamma 2; the stop string is more tokens than that.
    # Prompt lookup keeps this case on the speculative path without loading the draft model.
    proc = tandem("--ctx", "64", "--raw", "--prompt", CODE, "--drafter", "lookup", "--policy",
                  "fixed", "--gamma", "2", "--stop", "return a + b", "--max-tokens", "40",
                  "--json")
    assert proc.returncode == 0
    out = json.loads(proc.stdout)
    assert out["stats"]["finish_reason"] == "stop", out
    assert out["stats"]["rounds"] >= 2 and out["stats"]["mode"] == "speculative"
    assert "return a + b" not in out["text"] and "a +" not in out["text"]


@pytest.mark.long
@pytest.mark.real
def test_ctrl_c_during_a_real_generation_exits_130_with_one_line(embedded_paths):
    proc = subprocess.Popen([sys.executable, "-u", "-m", "app.cli", "generate", "--threads", "2",
                             "--draft", "none", "--ctx", "256", "--max-tokens", "200", "--prompt",
                             ESSAY], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.read(1)  # the first token is out: llama.cpp is decoding
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "interrupted" in err and "Traceback" not in err
