"""What is in the local store: GGUF files with size, quantization and whether their SHA-256 was verified.

A verified file has a stamp `<file>.sha256` holding "SHA256 SIZE MTIME_NS [SOURCE]", written only
after the hash was checked (against the hub's metadata for pulls, the recorded hash for the
embedded pair). The stamp counts only while size and mtime still match, so an edited or
replaced file shows as unverified without re-hashing gigabytes on every listing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError
from models.gguf_info import read_info
from models.tandem_store import store_dir

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LocalModel:
    path: Path
    size: int
    quant: str
    verified: bool
    sha256: str | None
    source: str | None


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_stamp(path: Path, sha256: str, source: str = "") -> None:
    st = path.stat()
    stamp_path(path).write_text(f"{sha256} {st.st_size} {st.st_mtime_ns} {source}".rstrip() + "\n")


def read_stamp(path: Path) -> tuple[str | None, str | None]:
    """(sha256, source) when the stamp is present and still matches the file, else (None, None)."""
    stamp = stamp_path(path)
    if not stamp.is_file() or not path.is_file():
        return None, None
    fields = stamp.read_text().split()
    st = path.stat()
    if len(fields) < 3 or not _SHA256.fullmatch(fields[0]) or fields[1:3] != [str(st.st_size), str(st.st_mtime_ns)]:
        return None, None
    return fields[0], (fields[3] if len(fields) > 3 else None)


def describe(path: Path) -> LocalModel:
    sha, source = read_stamp(path)
    try:
        quant = read_info(path).file_type
    except ModelFileError as e:
        quant = f"unreadable ({e})"
    return LocalModel(path, path.stat().st_size, quant, sha is not None, sha, source)


def list_local(directory: Path | None = None) -> list[LocalModel]:
    """Every *.gguf in the store, sorted by name."""
    d = directory or store_dir()
    return [describe(p) for p in sorted(d.glob("*.gguf")) if p.is_file()]
