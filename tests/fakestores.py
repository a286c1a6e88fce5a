"""Fake model stores of other tools, laid out as each tool lays them out, in a temporary HOME:
the Hugging Face hub cache (blobs, snapshot links, refs), LM Studio (PUBLISHER/REPO/FILE),
Ollama (manifests naming a model-layer blob) and llama.cpp's download cache; `machine` fills
one of each with tiny GGUFs, usable, broken and partial."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np

from tests import tinygguf

# The names the fake machine's models are found under.
BIG = "org/Big-GGUF:big-Q8_0.gguf"
MID = "pub/Mid-GGUF:mid-Q4_K_M.gguf"
SMALL = "tiny:small"
WARN = "org_Warn-GGUF_warn-Q8_0.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ENV = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS",
       "LLAMA_CACHE", "TANDEM_MODEL_DIRS", "TANDEM_HOME")


def isolate(monkeypatch, home: Path) -> Path:
    """Point HOME at `home`, with none of the variables that move the stores set, and the model
    store in it; returns the store."""
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    store = home / "tandem-store"
    monkeypatch.setenv("TANDEM_MODELS", str(store))
    return store


def hf_cache(root: Path, repo_id: str, filename: str, source: Path) -> Path:
    """huggingface_hub's layout: blobs/ETAG, snapshots/COMMIT/FILE linking to it, refs/main."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    data = source.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = repo / "snapshots" / COMMIT / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return link


def lmstudio(home: Path, publisher: str, repo: str, filename: str, source: Path) -> Path:
    dest = home / ".lmstudio" / "models" / publisher / repo / filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def ollama_manifest(root: Path, model: str, tag: str, layers: list[dict],
                    namespace: str = "library", host: str = "registry.ollama.ai") -> Path:
    manifest = root / "manifests" / host / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "c" * 64, "size": 2}, "layers": layers}))
    return manifest


def ollama(root: Path, model: str, tag: str, source: Path | None, *, digest: str | None = None,
           namespace: str = "library", host: str = "registry.ollama.ai") -> Path:
    """Ollama's layout: the GGUF as blobs/sha256-HEX, named by a manifest's model layer (beside
    a template layer). `source` None writes the manifest only, its blob missing."""
    data = source.read_bytes() if source is not None else b""
    hexdigest = digest or hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{hexdigest}"
    if source is not None:
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
    ollama_manifest(root, model, tag, [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{hexdigest}",
         "size": len(data)},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "d" * 64,
         "size": 10}], namespace=namespace, host=host)
    return blob


def llama_cpp(root: Path, filename: str, source: Path) -> Path:
    dest = root / filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def projector(path: Path) -> Path:
    """A GGUF that is not a model: a vision projector (architecture clip, no vocabulary)."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def machine(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """A HOME under `tmp_path` holding one store of each kind, with usable, broken and partial
    files; returns (home, a folder for --models-dir, the Tandem store)."""
    home = tmp_path / "home"
    store = isolate(monkeypatch, home)
    src = tmp_path / "src"
    src.mkdir()
    big = tinygguf.write(src / "big.gguf", tokens=tinygguf.vocab(400), n_layer=8, n_embd=32)
    mid = tinygguf.write(src / "mid.gguf", tokens=tinygguf.vocab(400), n_layer=4, n_embd=32)
    small = tinygguf.write(src / "small.gguf", tokens=tinygguf.vocab(400), n_layer=1, n_embd=16)
    warn = tinygguf.write(src / "warn.gguf", tokens=tinygguf.vocab(400), n_layer=2, n_embd=16,
                          template="{{ other }}")
    other = tinygguf.write(src / "other.gguf", tokens=tinygguf.vocab(200), n_layer=1, n_embd=16)
    cache = home / ".cache"
    hf_cache(cache / "huggingface" / "hub", "org/Big-GGUF", "big-Q8_0.gguf", big)
    lmstudio(home, "pub", "Mid-GGUF", "mid-Q4_K_M.gguf", mid)
    broken = lmstudio(home, "pub", "Broken-GGUF", "broken.gguf", big)
    with open(broken, "r+b") as f:  # an interrupted download: the header is whole, the data not
        f.truncate(broken.stat().st_size // 2)
    ollama_root = home / ".ollama" / "models"
    ollama(ollama_root, "tiny", "small", small)
    ollama(ollama_root, "tiny", "latest", small)  # a second tag of the same blob
    ollama(ollama_root, "gone", "1b", None, digest="e" * 64)
    ollama_manifest(ollama_root, "bad", "json", []).write_text("{not json")
    llama_cpp(cache / "llama.cpp", WARN, warn)
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copyfile(other, folder / "other-vocab.gguf")
    projector(folder / "mmproj-f16.gguf")
    (folder / "notes.gguf").write_text("not a model at all")
    return home, folder, store
