"""The API over a fake pair, in-process: a Starlette TestClient and an openai client on it."""
from __future__ import annotations

from fastapi.testclient import TestClient

from app.serve.access import Access
from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from app.runtime.holder import PairHolder
from engine.pair import Pair
from tests.byte_fake import ChatByteFake
from bench.fakes.backend import FakeBackend

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
N_CTX = 256
MODEL = "fake-1-0.0"
# The Host the test client sends.
TEST_HOST = "testserver"


def fake_pair() -> Pair:
    # A draft close to the target, so speculation accepts some tokens and rejects others.
    return Pair(FakeBackend(seed=1, n_ctx=N_CTX), FakeBackend(seed=1, noise=0.5, n_ctx=N_CTX))


def byte_pair() -> Pair:
    """A pair whose tokens are bytes (tests/byte_fake.py): grammars and tool calls work on it."""
    return Pair(ChatByteFake(seed=1, n_ctx=4 * N_CTX), ChatByteFake(seed=1, noise=0.5, n_ctx=4 * N_CTX))


def agent_pair() -> Pair:
    """A pair that answers as a small tool-using model (tests/agent_fake.py): the clients' suite."""
    from tests.agent_fake import AgentFake
    return Pair(AgentFake(seed=1, n_ctx=8 * N_CTX), AgentFake(seed=1, noise=0.5, n_ctx=8 * N_CTX))


def serve_access(api_key: str | None = API_KEY, **kwargs) -> Access:
    """The access of `tandem serve` on 127.0.0.1:8080, also answering the test client's Host."""
    return Access("127.0.0.1", 8080, allowed_hosts=((TEST_HOST, None),), api_key=api_key, **kwargs)


def api_client(max_queue: int = 2, api_key: str | None = API_KEY) -> tuple[TestClient, GenerationQueue]:
    queue = GenerationQueue(max_queue)
    app = create_app(PairHolder(fake_pair(), queue=queue), queue, serve_access(api_key))
    return TestClient(app, headers=AUTH if api_key else {}), queue
