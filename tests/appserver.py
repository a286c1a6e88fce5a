"""Launch the app on a free local port for the app tests, over a real or a fake pair."""
from __future__ import annotations

import socket
import subprocess
import time
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app.serve.access import Access
from app.serve.server import launch
from app.ui import build_app, page_mounter
from app.runtime.holder import PairHolder
from engine.backend import ModelConfig
from loading.chats import ChatStore

# The embedded draft serves as both target and draft: same tokenizer, and fast enough on 2 cores.
SMALL_MODEL = Path.home() / ".cache" / "tandem" / "models" / "qwen2.5-coder-0.5b-instruct.gguf"
N_CTX = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc: subprocess.Popen, url: str, seconds: float = 300) -> None:
    """Wait until a server process started by a test answers 200 at `url` (its /health, say); fail
    the test with its output if it exits first, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no answer at {url}")
        time.sleep(0.5)


def small_model() -> Path:
    if not SMALL_MODEL.is_file():
        from models import embedded
        embedded.ensure()
    return SMALL_MODEL


def load_small_pair(holder: PairHolder) -> None:
    path = str(small_model())
    error = holder.load(ModelConfig(path, n_ctx=N_CTX, n_threads=2), ModelConfig(path, n_ctx=N_CTX, n_threads=2))
    assert error is None, error


@contextmanager
def serve(holder: PairHolder, api=None) -> Iterator[str]:
    """The page (and `api`, an APIRouter, beside it) on 127.0.0.1 and a free port, with an empty
    chats store of its own: a page opens the chat open last, with its settings, so a chat one
    test left must not change the next test's page."""
    chats = ChatStore(Path(tempfile.mkdtemp(prefix="tandem-test-chats-")))
    running = launch(page_mounter(build_app(holder, chats=chats)),
                     Access("127.0.0.1", free_port(), keyed=("/v1",)), api)
    try:
        yield running.url
    finally:
        running.close()
