"""A local stand-in for the Hugging Face hub on 127.0.0.1, for download tests without network.

It answers the routes huggingface_hub calls: model search (/api/models), model info
(/api/models/{repo}[/revision/{rev}]), the file tree (/api/models/{repo}/tree/{rev}), paths-info
(POST /api/models/{repo}/paths-info/{rev}) and HEAD/GET on /{repo}/resolve/{rev}/{file} with
Range support and the X-Repo-Commit / X-Linked-Etag / X-Linked-Size headers the library reads.
Test hooks: `corrupt` serves other bytes than the metadata describes, `cut` drops the connection
after N bytes for the next K GETs of a file, and `log` records every request.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubState:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    corrupt: dict[tuple[str, str], bytes] = field(default_factory=dict)
    cut: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # key -> [after_bytes, times]
    log: list[tuple[str, str, str | None]] = field(default_factory=list)

    def entry(self, repo: str, path: str) -> dict:
        data = self.repos[repo][path]
        sha = hashlib.sha256(data).hexdigest()
        git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return {"type": "file", "oid": git_oid, "size": len(data), "path": path,
                "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}}


_REPO_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(tree|revision|paths-info)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args: object) -> None:
        pass

    @property
    def state(self) -> HubState:
        return self.server.state

    def _json(self, obj: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found(self, code: str, message: str) -> None:
        self._json({"error": message}, 404, {"X-Error-Code": code, "X-Error-Message": message})

    def _route(self) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.state.log.append((self.command, path, self.headers.get("Range")))
        if path == "/api/models" and self.command == "GET":
            return self._search(parse_qs(url.query))
        m = _REPO_API.match(path)
        if m:
            repo, kind, _rev, sub = m.groups()
            if repo not in self.state.repos:
                return self._not_found("RepoNotFound", "Repository not found")
            if kind in (None, "revision"):
                return self._json({"id": repo, "sha": COMMIT, "tags": ["gguf"],
                                   "siblings": [{"rfilename": f} for f in self.state.repos[repo]]})
            if kind == "tree":
                prefix = (sub or "").strip("/")
                return self._json([self.state.entry(repo, f) for f in self.state.repos[repo] if f.startswith(prefix)])
            if kind == "paths-info" and self.command == "POST":
                n = int(self.headers.get("Content-Length", 0))
                form = parse_qs(self.rfile.read(n).decode())
                wanted = form.get("paths", [])
                return self._json([self.state.entry(repo, f) for f in wanted if f in self.state.repos[repo]])
        m = _RESOLVE.match(path)
        if m and self.command in ("GET", "HEAD"):
            return self._file(*m.groups())
        self._not_found("EntryNotFound", f"no route {path}")

    def _search(self, q: dict[str, list[str]]) -> None:
        term = q.get("search", [""])[0].lower()
        limit = int(q.get("limit", ["1000"])[0])
        hits = [{"id": r, "downloads": 10 * len(fs), "likes": 1, "tags": ["gguf"]}
                for r, fs in sorted(self.state.repos.items()) if term in r.lower()]
        self._json(hits[:limit])

    def _file(self, repo: str, _rev: str, filename: str) -> None:
        if repo not in self.state.repos:
            return self._not_found("RepoNotFound", "Repository not found")
        if filename not in self.state.repos[repo]:
            return self._not_found("EntryNotFound", "Entry not found")
        meta = self.state.entry(repo, filename)
        data = self.state.corrupt.get((repo, filename), self.state.repos[repo][filename])
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
        body = data[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("ETag", f'"{meta["lfs"]["oid"]}"')
        self.send_header("X-Linked-Etag", f'"{meta["lfs"]["oid"]}"')
        self.send_header("X-Linked-Size", str(meta["size"]))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = self.state.cut.get((repo, filename))
        if cut and cut[1] > 0:
            cut[1] -= 1
            self.wfile.write(body[: max(cut[0] - start, 0)])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._route()

    def do_HEAD(self) -> None:  # noqa: N802
        self._route()

    def do_POST(self) -> None:  # noqa: N802
        self._route()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: HubState


class HubServer:
    """Context manager: `with HubServer() as hub: hub.url, hub.state`."""

    def __init__(self) -> None:
        self.state = HubState()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def add(self, repo: str, filename: str, data: bytes) -> None:
        self.state.repos.setdefault(repo, {})[filename] = data

    def gets(self, filename: str) -> list[str | None]:
        """The Range header of every GET of a file, in order (None for a full request)."""
        return [rng for method, path, rng in self.state.log if method == "GET" and path.endswith("/" + filename)]

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def closed_port_url() -> str:
    """An endpoint nothing listens on: bind a port, then release it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
