"""Models other tools keep on this machine: fake HF-cache, LM Studio, Ollama and llama.cpp
stores (and a --models-dir folder) in a temporary HOME, with tiny GGUFs. They are found, listed
with their header facts, paired, resolved by name (Ollama spellings too) and loaded where they
lie; broken and partial files are listed with their reason; a scan of 100 files is quick."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest

from app.cli import main as cli_main
from engine.llama import backend as llama
from engine.backend import ModelConfig
from engine.errors import ModelFileError
from models import disk_pairs, found, other_stores
from tests import fakestores, file_reads, tinygguf
from tests.fakestores import BIG, MID, SMALL, WARN
from bench.fakes.backend import FakeBackend


@pytest.fixture
def machine(tmp_path, monkeypatch):
    return fakestores.machine(tmp_path, monkeypatch)


def by_name(scan: found.Scan) -> dict[str, found.FoundModel]:
    return {m.name: m for m in scan.models}


def test_every_kind_of_store_is_found_and_described(machine):
    home, folder, _ = machine
    scan = found.scan([folder])
    models = by_name(scan)
    assert {m.name: m.source for m in scan.usable} == {
        BIG: other_stores.HF, MID: other_stores.LMSTUDIO, SMALL: other_stores.OLLAMA, WARN: other_stores.LLAMA_CPP,
        "other-vocab.gguf": other_stores.FOLDER}
    big = models[BIG]
    assert big.path.parent.parent.name == "snapshots" and big.path.is_symlink()
    assert big.cells() == [BIG, "HF cache", "llama", "21K", "ALL_F32", found.size_text(big.size),
                           "4096", "gpt2/qwen2 400"]
    assert models[SMALL].path.name.startswith("sha256-") and models[SMALL].aliases == ("tiny:latest",)
    assert "Ollama" in scan.where_searched() and "(absent)" in scan.where_searched()


def test_broken_and_partial_files_are_listed_with_their_reason(machine):
    _, folder, _ = machine
    models = by_name(found.scan([folder]))
    reasons = {name: m.problem for name, m in models.items() if not m.ok}
    assert "truncated" in reasons["pub/Broken-GGUF:broken.gguf"]
    assert "blob sha256-eeee" in reasons["gone:1b"] and "`ollama pull gone:1b`" in reasons["gone:1b"]
    assert "manifest cannot be read" in reasons["bad:json"]
    assert "not a GGUF file" in reasons["notes.gguf"]
    assert "no vocabulary" in reasons["mmproj-f16.gguf"] and "clip" in reasons["mmproj-f16.gguf"]
    row = models["gone:1b"].cells()
    assert row[1] == "Ollama" and row[-1].startswith("unusable: its blob")


def test_names_resolve_to_the_files_where_they_lie(machine):
    home, folder, _ = machine
    blob = by_name(found.scan())[SMALL].path
    # Ollama's spellings: another tag of the same blob, no tag (:latest), the prefixes spelt out.
    for spec in (SMALL, "tiny:latest", "tiny", "library/tiny:small",
                 "registry.ollama.ai/library/tiny:small"):
        assert other_stores.resolve(spec) == (blob, SMALL), spec
    big_path, name = other_stores.resolve(BIG)
    assert name == BIG and big_path.read_bytes()[:4] == b"GGUF"
    assert other_stores.resolve("mid-Q4_K_M.gguf")[1] == MID  # a file name only one model has
    assert other_stores.resolve("other-vocab.gguf", [folder])[1] == "other-vocab.gguf"
    with pytest.raises(ModelFileError, match=r"^gone:1b \(Ollama\) cannot be used: its blob"):
        other_stores.resolve("gone:1b")
    with pytest.raises(ModelFileError, match="'qwen9:70b' is neither a model file nor a model found"):
        other_stores.resolve("qwen9:70b")
    path = str(home / "nowhere.gguf")
    assert other_stores.resolve(path) == (Path(path), "")  # a missing path is left for loading to report


def test_the_hf_cache_follows_hf_home_and_hf_hub_cache(machine, tmp_path, monkeypatch):
    elsewhere = tmp_path / "hfhome"
    monkeypatch.setenv("HF_HOME", str(elsewhere))
    assert BIG not in by_name(found.scan())
    fakestores.hf_cache(elsewhere / "hub", "org/Else-GGUF", "else.gguf", tinygguf.write(tmp_path / "e.gguf"))
    assert "org/Else-GGUF:else.gguf" in by_name(found.scan())
    monkeypatch.setenv("HF_HUB_CACHE", str(Path.home() / ".cache" / "huggingface" / "hub"))
    assert BIG in by_name(found.scan()) and "org/Else-GGUF:else.gguf" not in by_name(found.scan())


def test_ollama_models_and_tandem_model_dirs_move_with_their_variables(machine, tmp_path, monkeypatch):
    home, folder, _ = machine
    moved = tmp_path / "ollama-elsewhere"
    fakestores.ollama(moved, "moved", "7b", tinygguf.write(tmp_path / "m.gguf"))
    monkeypatch.setenv("OLLAMA_MODELS", str(moved))
    monkeypatch.setenv("TANDEM_MODEL_DIRS", os.pathsep.join([str(folder), str(tmp_path / "absent")]))
    names = by_name(found.scan())
    assert "moved:7b" in names and SMALL not in names and "other-vocab.gguf" in names


def test_pairs_from_disk_are_the_compatible_drafts_best_first(machine):
    _, folder, _ = machine
    scan = found.scan([folder])
    pairs = {p.target.name: p for p in disk_pairs.pairs(scan.usable)}
    big = pairs[BIG]
    # Compatible before compatible-with-a-warning, then the cheaper draft; the draft with another
    # vocabulary is not offered, nor a model larger than the target.
    assert [(d.draft.name, d.verdict, d.budget) for d in big.drafts] == [
        (SMALL, "compatible", "fits"), (MID, "compatible", "fits"), (WARN, "warning", "fits")]
    assert "chat templates differ" in big.drafts[2].label()
    assert [d.draft.name for d in pairs[MID].drafts] == [SMALL, WARN]
    assert SMALL not in pairs and "other-vocab.gguf" not in pairs


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_models_list_shows_what_is_on_disk_and_the_pairs(machine):
    _, folder, _ = machine
    rc, out, _ = run_cli(["models", "list", "--models-dir", str(folder)])
    assert rc == 0
    section = out.split("on this machine", 1)[1]
    header = section.splitlines()[1].split()
    assert header[:3] == ["NAME", "FOUND", "IN"] and header[-1] == "TOKENIZER"
    assert f"{SMALL} " in section and "also known as tiny:latest" in section
    assert "unusable: its blob sha256-eeee" in section
    pairs = section.split("pairs on this machine", 1)[1]
    assert f"tandem generate --target {BIG} --draft {SMALL}" in pairs
    assert f"    {SMALL}: compatible; memory: fits" in pairs


def fake_load(configs: list[ModelConfig]):
    def load(config: ModelConfig) -> FakeBackend:
        configs.append(config)
        # The target first, exact; the draft after it, close to it.
        backend = FakeBackend(n_ctx=config.n_ctx, noise=0.0 if len(configs) == 1 else 0.5)
        backend.name = config.name or Path(config.path).name
        return backend
    return load


def test_generate_loads_found_models_by_name_where_they_lie(machine):
    home, _, store = machine
    blob = by_name(found.scan())[SMALL].path
    blob.chmod(0o444)
    blob.parent.chmod(0o555)  # an Ollama blob is read-only to us

    def files() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in home.rglob("*")
                if p.is_file() and store not in p.parents}

    before = files()
    configs: list[ModelConfig] = []
    try:
        with mock.patch.object(llama, "load", fake_load(configs)):
            rc, out, err = run_cli(["generate", "--prompt", "hi", "--target", BIG, "--draft", "tiny",
                                    "--draft-quant", "off", "--max-tokens", "4", "--json"])
    finally:
        blob.parent.chmod(0o755)
    assert rc == 0, err
    assert [(c.name, Path(c.path)) for c in configs] == [(BIG, other_stores.resolve(BIG)[0]), (SMALL, blob)]
    # Nothing was copied or linked into the store; nothing was written beside the files.
    assert not list(store.rglob("*.gguf"))
    assert files() == before


def test_an_unknown_name_is_one_error_line(machine):
    rc, _, err = run_cli(["generate", "--prompt", "hi", "--target", "qwen9:70b", "--draft", "none"])
    assert rc == 2 and err.count("\n") == 1 and "`tandem models list` shows what was found" in err
    rc, _, err = run_cli(["generate", "--prompt", "hi", "--target", "gone:1b", "--draft", "none"])
    assert rc == 2 and "gone:1b (Ollama) cannot be used" in err


def test_budget_takes_found_names(machine):
    rc, out, _ = run_cli(["budget", "--target", BIG, "--draft", SMALL, "--ctx", "256"])
    assert rc == 0 and "verdict: fits" in out


def test_a_scan_of_100_files_reads_each_header_once(tmp_path, monkeypatch):
    fakestores.isolate(monkeypatch, tmp_path / "home")
    folder = tmp_path / "many"
    folder.mkdir()
    one = tinygguf.write(tmp_path / "one.gguf", tokens=tinygguf.vocab(400))
    for i in range(100):
        shutil.copyfile(one, folder / f"model-{i:03d}.gguf")
    with file_reads.counted(folder) as reads:
        scan = found.scan([folder])
    assert len(scan.usable) == 100
    # What keeps a scan quick, counted rather than timed: each file is opened once and read at
    # most once through (no hash of the file, no second pass).
    files = sorted(folder.resolve().iterdir())
    assert sorted(reads.opens) == files and set(reads.opens.values()) == {1}
    assert all(reads.bytes[f] <= f.stat().st_size for f in files)
