"""The model subcommands, run through argparse exactly as `tandem` registers them."""
from __future__ import annotations

import argparse

import pytest

from engine.errors import HubError, ModelFileError, TandemError
from models.cli import register
from tests import realmodels, tinygguf
from tests.hubserver import HubServer


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tandem")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def store(tmp_path, monkeypatch):
    d = tmp_path / "store"
    monkeypatch.setenv("TANDEM_MODELS", str(d))
    return d


def test_models_list_shows_catalog_and_store(store, capsys):
    store.mkdir(parents=True)
    tinygguf.write(store / "mine.gguf")
    assert run(["models", "list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split()[0] == "qwen2.5-coder-1.5b+0.5b"
    for family in ("qwen2.5-coder-32b+0.5b", "qwen2.5-72b+0.5b", "qwen3-32b+0.6b", "llama-3.3-70b+1b",
                   "gemma-3-27b+1b", "smollm2-1.7b+135m"):
        assert family in out
    assert "mine.gguf" in out and "ALL_F32" in out and "sha256 not verified" in out


def test_compat_exit_codes(tmp_path, capsys):
    t = tinygguf.write(tmp_path / "t.gguf")
    same = tinygguf.write(tmp_path / "same.gguf", n_layer=1)
    other = tinygguf.write(tmp_path / "other.gguf", add_bos=True)
    assert run(["compat", str(t), str(same)]) == 0
    assert capsys.readouterr().out.startswith("compatible:")
    assert run(["compat", str(t), str(other)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("incompatible:") and "add-BOS flag differs" in out
    with pytest.raises(ModelFileError, match="model file not found"):
        run(["compat", str(t), str(tmp_path / "missing.gguf")])


def test_budget_prints_breakdown(tmp_path, capsys):
    t = tinygguf.write(tmp_path / "t.gguf", n_layer=4)
    d = tinygguf.write(tmp_path / "d.gguf", n_layer=1)
    assert run(["budget", "--target", str(t), "--draft", str(d), "--ctx", "2048", "--kv-type", "q8_0"]) == 0
    out = capsys.readouterr().out
    assert "KV q8_0" in out and "KV cache (CPU)" in out and "verdict: fits" in out


def test_budget_needs_local_files(store):
    with pytest.raises(ModelFileError, match="tandem pull"):
        run(["budget", "--target", "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "--draft", "x/y"])


def test_pull_repo_file_and_by_quant(store, tmp_path, capsys, monkeypatch):
    data = tinygguf.write(tmp_path / "src.gguf").read_bytes()
    with HubServer() as h:
        h.add("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", data)
        h.add("org/Tiny-GGUF", "tiny-Q8_0.gguf", data + b"\0" * 32)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        assert run(["pull", "org/Tiny-GGUF:tiny-Q8_0.gguf"]) == 0
        assert run(["pull", "org/Tiny-GGUF", "--quant", "q4_k_m"]) == 0
        with pytest.raises(HubError, match="0 GGUF files for Q2_K .*Q4_K_M, Q8_0"):
            run(["pull", "org/Tiny-GGUF", "--quant", "Q2_K"])
        assert run(["models", "list"]) == 0
    assert (store / "tiny-Q4_K_M.gguf").read_bytes() == data
    out = capsys.readouterr().out
    assert "tiny-Q8_0.gguf" in out and "sha256 verified" in out


def test_pull_unknown_spec(store):
    with pytest.raises(TandemError, match="neither a catalog pair"):
        run(["pull", "no-such-pair"])


@pytest.mark.real
def test_budget_for_embedded_pair_by_id(capsys):
    realmodels.embedded_pair()
    assert run(["budget", "--target", "qwen2.5-coder-1.5b+0.5b", "--ctx", "2048"]) == 0
    out = capsys.readouterr().out
    assert "KV cache (CPU)" in out and "56.0" in out and "24.0" in out
