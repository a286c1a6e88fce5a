"""Each model file's header is parsed once per load: `tandem generate` and `tandem serve` read
it in the load's plan and hand that description to everything that needs it (the pairing
record's candidate name, the checks, the early-exit derivation, the history's tokenizer hash)."""
from __future__ import annotations

import contextlib
import io
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest

from app import serve_cli
from app.cli import build_parser, main as cli_main
from engine.llama import backend as llama
from models import gguf_info
from tests import tinygguf
from bench.fakes.backend import FakeBackend


@pytest.fixture
def headers(tmp_path, monkeypatch) -> Counter:
    """Header parses per file, counted at the one function that parses a header."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("TANDEM_HISTORY", str(tmp_path / "history"))
    counts: Counter = Counter()
    parse = gguf_info._header

    def counted(path: Path):
        counts[Path(path).name] += 1
        return parse(path)
    monkeypatch.setattr(gguf_info, "_header", counted)
    return counts


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    return (tinygguf.write(tmp_path / "target.gguf", n_layer=4),
            tinygguf.write(tmp_path / "draft.gguf", n_layer=2))


def fake_load(config):
    return FakeBackend(n_vocab=300, eog=2)


@pytest.mark.parametrize("drafter", ["hybrid", "early-exit"])
def test_generate_parses_each_header_once(headers, files, drafter):
    target, draft = files
    with mock.patch.object(llama, "load", fake_load), \
            contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["generate", "--prompt", "hi", "--target", str(target), "--draft",
                       str(draft), "--drafter", drafter, "--max-tokens", "4", "--ctx", "256"])
    assert rc == 0
    read = {"target.gguf": 1} | ({"draft.gguf": 1} if drafter == "hybrid" else {})
    assert dict(headers) == read


def test_serve_parses_each_header_once(headers, files, monkeypatch):
    target, draft = files
    served = []

    def serve(holder, access):
        served.append(holder.history is not None)
        holder.close()
        return 0
    monkeypatch.setattr(serve_cli, "serve", serve)
    args = build_parser().parse_args(["serve", "--target", str(target), "--draft", str(draft),
                                      "--ctx", "256"])
    with mock.patch.object(llama, "load", fake_load), \
            contextlib.redirect_stdout(io.StringIO()):
        assert args.func(args) == 0
    assert served == [True]
    assert dict(headers) == {"target.gguf": 1, "draft.gguf": 1}
