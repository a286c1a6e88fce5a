"""Bad input through `tandem generate`: one clear line on stderr, no traceback, no crash."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import tinygguf

ROOT = Path(__file__).resolve().parents[1]


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def assert_clean_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_target_file(tmp_path):
    proc = tandem("generate", "--prompt", "hi", "--target", str(tmp_path / "nope.gguf"), "--draft", "none")
    assert_clean_error(proc, "not found", "nope.gguf")


def test_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n" * 100)
    proc = tandem("generate", "--prompt", "hi", "--target", str(bad), "--draft", "none")
    assert_clean_error(proc, "not a GGUF")


def test_truncated_gguf(tmp_path):
    whole = tinygguf.write(tmp_path / "whole.gguf", pad_bytes=1 << 16)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    proc = tandem("generate", "--prompt", "hi", "--target", str(cut), "--draft", "none")
    assert_clean_error(proc, "truncated")


def test_draft_with_another_tokenizer(tmp_path):
    target = tinygguf.write(tmp_path / "target.gguf", tokenizer_model="gpt2")
    draft = tinygguf.write(tmp_path / "draft.gguf", tokenizer_model="llama")
    proc = tandem("generate", "--prompt", "hi", "--target", str(target), "--draft", str(draft))
    assert_clean_error(proc, "tokenizer")


@pytest.mark.parametrize("flag, value, word", [
    ("--gamma", "-1", "gamma"),
    ("--temperature", "-0.5", "temperature"),
    ("--top-p", "0", "top_p must be in (0, 1]"),
    ("--top-p", "1.5", "top_p"),
    ("--max-tokens", "0", "max_tokens must be"),
    ("--seed", "-2", "seed must be >= -1 (-1 is random), got -2"),
    ("--top-k", "2.5", "top_k must be an integer, got 2.5"),
    ("--drafter", "oracle", "drafter must be one of"),
])
def test_bad_settings(tmp_path, flag, value, word):
    proc = tandem("generate", "--prompt", "hi", "--target", str(tmp_path / "x.gguf"), "--draft", "none",
                  flag, value)
    assert_clean_error(proc, word)


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "gone.py", ("--prediction: file not found", "gone.py")),
    (lambda d: d, ("--prediction:", "is a folder")),
    (lambda d: (d / "latin1.py").write_bytes(b"caf\xe9\n") and d / "latin1.py",
     ("--prediction:", "is not UTF-8 text")),
])
def test_a_prediction_file_that_cannot_be_read(tmp_path, make, words):
    """--prediction FILE is read before any model loads: one line naming the option."""
    proc = tandem("generate", "--prompt", "hi", "--target", str(tmp_path / "never.gguf"),
                  "--draft", "none", "--prediction", str(make(tmp_path)))
    assert_clean_error(proc, *words)
