"""The adapted draft in the store (`tandem adapt`, bench/adapt/): a derived file of the draft
(loading/derived/files.py), named `<draft stem>.adapted-<12 hex>.<draft hash>.gguf`, where the
12 hex are a hash of what else it was made from: the target's SHA-256, its adapters' and the
teacher data's. Another target, adapter or data set names another file; another draft, another
hash. The pairing record names the file (models/tuned.py `AdaptedDraft`), and its staleness
rules decide whether it is used.

The build runs in a work folder beside the store's derived files (the trainer's F32 copy and its
saved model, removed however the build ends), and the adapted draft appears only by the derived
files' atomic rename: Ctrl-C or a failure leaves the draft and any earlier adapted draft whole.
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Callable

from loading.derived.files import derive, derived_dir

# build(work folder, output path) trains the draft and writes the adapted draft to the path.
Build = Callable[[Path, Path], None]


def adapted_tag(target_sha: str, adapter_sha: str, data_sha: str) -> str:
    whole = "|".join((target_sha, adapter_sha, data_sha))
    return f"adapted-{hashlib.sha256(whole.encode()).hexdigest()[:12]}"


def derive_adapted(draft: Path, target_sha: str, adapter_sha: str, data_sha: str,
                   build: Build) -> Path:
    """The adapted draft for these hashes: the current one, else built by `build`."""
    def prepare(source: Path, sha: str) -> Callable[[Path], None]:
        def write(out: Path) -> None:
            with tempfile.TemporaryDirectory(dir=derived_dir(), prefix=".adapt-") as work:
                build(Path(work), out)
        return write
    return derive(draft, adapted_tag(target_sha, adapter_sha, data_sha), prepare)
