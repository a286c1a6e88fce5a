"""Hugging Face hub access: search GGUF repos, list their GGUF files, pull one into the store.

Everything goes through huggingface_hub (HfApi, hf_hub_url, get_hf_file_metadata, http_get).
`pull` keeps its partial file in the store under a name tied to the expected SHA-256, so a
download cut off (network drop, Ctrl-C, crash) resumes from where it stopped on the next pull:
http_get retries a dropped connection itself with a Range request, and a later pull passes the
partial size as `resume_size`. A file whose size or SHA-256 disagrees with the hub's metadata is
deleted, never registered; a catalog file whose hub size differs from the size the catalog
records is refused before any byte is fetched. The endpoint is read at call time (argument, then HF_ENDPOINT), since
huggingface_hub freezes HF_ENDPOINT when first imported.
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from huggingface_hub import HfApi, RepoFile, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.file_download import http_get

from engine.errors import HubError
from models.catalog import recorded_size
from models.registry import read_stamp, write_stamp
from models.tandem_store import sha256_of, store_dir

# An optional dependency's fallback, at the top of the module like any import.
try:
    import httpx2 as _http
except ImportError:  # huggingface_hub < 1.x used httpx
    import httpx as _http  # type: ignore[no-redef]

Progress = Callable[[int, int], None]
OFFLINE_HINT = ("offline options: the embedded pair (`tandem models list`, first entry) or a local file "
                "with `--target PATH --draft PATH`")
_QUANT = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|BF16|F32)(?:[-_.]|$)")


@dataclass(frozen=True)
class RepoHit:
    repo_id: str
    downloads: int | None
    likes: int | None


@dataclass(frozen=True)
class RemoteFile:
    repo_id: str
    filename: str
    size: int
    sha256: str | None
    quant: str


def endpoint(explicit: str | None = None) -> str:
    return (explicit or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def quant_of(filename: str) -> str:
    """The quantization named in a GGUF file name (Q4_K_M, Q8_0, F16...), or '?'."""
    stem = Path(filename).name.removesuffix(".gguf")
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else "?"


@contextlib.contextmanager
def _hub_errors(what: str, ep: str) -> Iterator[None]:
    """Turn huggingface_hub and transport failures into one-line HubErrors."""
    try:
        yield
    except RepositoryNotFoundError:
        raise HubError(f"{what}: repository not found on {ep}") from None
    except RevisionNotFoundError:
        raise HubError(f"{what}: revision not found on {ep}") from None
    except EntryNotFoundError:
        raise HubError(f"{what}: file not found on {ep}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubError(f"{what}: the hub at {ep} answered HTTP {status}; {OFFLINE_HINT}") from None
    except (_http.TransportError, ConnectionError, TimeoutError) as e:
        raise HubError(f"{what}: cannot reach the hub at {ep} ({type(e).__name__}); {OFFLINE_HINT}") from None


def probe(ep: str, what: str, hint: str = OFFLINE_HINT) -> None:
    """Fail in a second when the hub host is unreachable: paginated calls retry for ~20 s before giving up."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return  # only the proxy knows whether the hub is reachable
    u = urlparse(ep)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname or "", port), timeout=5).close()
    except OSError as e:
        raise HubError(f"{what}: cannot reach the hub at {ep} ({e.strerror or type(e).__name__}); {hint}") from None


def search(query: str, limit: int = 20, *, endpoint_url: str | None = None) -> list[RepoHit]:
    """GGUF model repositories whose name matches `query`, most downloaded first."""
    ep = endpoint(endpoint_url)
    probe(ep, f"searching for {query!r}")
    with _hub_errors(f"searching for {query!r}", ep):
        found = HfApi(endpoint=ep).list_models(search=query, filter="gguf", sort="downloads", limit=limit)
        return [RepoHit(m.id, m.downloads, m.likes) for m in found]


def list_gguf_files(repo_id: str, revision: str | None = None, *, endpoint_url: str | None = None) -> list[RemoteFile]:
    """The GGUF files in a repository, with size, LFS SHA-256 and quantization."""
    ep = endpoint(endpoint_url)
    probe(ep, f"listing {repo_id}")
    with _hub_errors(f"listing {repo_id}", ep):
        tree = HfApi(endpoint=ep).list_repo_tree(repo_id, revision=revision, recursive=True)
        return [_remote(repo_id, f) for f in tree if isinstance(f, RepoFile) and f.path.endswith(".gguf")]


def remote_files(repo_id: str, filenames: list[str], revision: str | None = None, *,
                 endpoint_url: str | None = None) -> dict[str, RemoteFile]:
    """Size, SHA-256 and quantization of the named files in one request; a file the repository
    does not hold is absent from the answer."""
    ep = endpoint(endpoint_url)
    with _hub_errors(f"{repo_id}/{', '.join(filenames)}", ep):
        infos = HfApi(endpoint=ep).get_paths_info(repo_id, filenames, revision=revision)
    return {f.path: _remote(repo_id, f) for f in infos if isinstance(f, RepoFile)}


def remote_file(repo_id: str, filename: str, revision: str | None = None, *,
                endpoint_url: str | None = None) -> RemoteFile:
    found = remote_files(repo_id, [filename], revision, endpoint_url=endpoint_url)
    if filename not in found:
        raise HubError(f"{repo_id}/{filename}: file not found on {endpoint(endpoint_url)}")
    return found[filename]


def _remote(repo_id: str, f: Any) -> RemoteFile:
    sha = f.lfs.sha256 if f.lfs is not None else None
    size = f.lfs.size if f.lfs is not None else f.size
    return RemoteFile(repo_id, f.path, int(size), sha, quant_of(f.path))


class _CallbackBar:
    """The progress-bar interface http_get drives, forwarding byte counts to a callback."""

    def __init__(self, callback: Progress | None, total: int, initial: int = 0, **_: Any) -> None:
        self.callback = callback
        self.total = total
        self.n = initial

    def __enter__(self) -> "_CallbackBar":
        if self.callback:
            self.callback(self.n, self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.callback:
            self.callback(self.n, self.total)


def partial_path(dest: Path, sha256: str) -> Path:
    return dest.with_name(f"{dest.name}.{sha256[:16]}.incomplete")


def pull(repo_id: str, filename: str, *, revision: str | None = None, progress: Progress | None = None,
         endpoint_url: str | None = None, store: Path | None = None) -> Path:
    """Download one file into the store, resuming a partial one; verify size and SHA-256; return its path."""
    ep = endpoint(endpoint_url)
    remote = remote_file(repo_id, filename, revision, endpoint_url=ep)
    if remote.sha256 is None:
        raise HubError(f"{repo_id}/{filename} has no SHA-256 in the hub's metadata (not an LFS file); refusing it")
    recorded = recorded_size(repo_id, filename)
    if recorded is not None and remote.size != recorded:
        raise HubError(f"{repo_id}/{filename} is {remote.size} bytes on the hub, but the catalog records"
                       f" {recorded}; refusing it (scripts/verify-catalog compares the catalog with the hub)")
    dest = (store or store_dir()) / Path(filename).name
    if read_stamp(dest)[0] == remote.sha256:
        if progress:
            progress(remote.size, remote.size)
        return dest
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=ep)
    with _hub_errors(f"{repo_id}/{filename}", ep):
        meta = get_hf_file_metadata(url, endpoint=ep)
    if meta.size is not None and meta.size != remote.size:
        raise HubError(f"{repo_id}/{filename}: the hub reports two sizes ({remote.size} and {meta.size}); try again later")

    part = partial_path(dest, remote.sha256)
    done = part.stat().st_size if part.exists() else 0
    if done > remote.size:
        part.unlink()
        done = 0
    # The hub's size, not the response's Content-Length, is the total: a resumed GET only carries the rest.
    bar = lambda initial=0, **_: _CallbackBar(progress, remote.size, initial)  # noqa: E731
    with _hub_errors(f"downloading {repo_id}/{filename}", ep), open(part, "ab") as f:
        try:
            http_get(meta.location, f, resume_size=done, expected_size=remote.size,
                     headers={"Accept-Encoding": "identity"}, tqdm_class=bar)  # type: ignore[arg-type]
        except OSError as e:
            if "Consistency check failed" in str(e):
                raise HubError(f"{repo_id}/{filename}: the download ended at the wrong size; run the pull again") from None
            raise

    size = part.stat().st_size
    actual = sha256_of(part)
    if size != remote.size or actual != remote.sha256:
        part.unlink()
        raise HubError(f"{repo_id}/{filename} failed its integrity check: expected sha256 {remote.sha256}"
                       f" ({remote.size} bytes), got {actual} ({size} bytes); the file was deleted")
    part.replace(dest)
    write_stamp(dest, actual, f"{repo_id}/{filename}")
    return dest
