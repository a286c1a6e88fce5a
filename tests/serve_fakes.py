"""The API over a fake pair, in-process: a Starlette TestClient and an openai client on it."""
from __future__ import annotations

from fastapi.testclient import TestClient

from app.runtime.queue import GenerationQueue
from app.serve.server import create_app
from app.runtime.holder import PairHolder
from engine.pair import Pair
from tests.fakes import FakeBackend

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
N_CTX = 256
MODEL = "fake-1-0.0"


def fake_pair() -> Pair:
    # A draft close to the target, so speculation accepts some tokens and rejects others.
    return Pair(FakeBackend(seed=1, n_ctx=N_CTX), FakeBackend(seed=1, noise=0.5, n_ctx=N_CTX))


def api_client(max_queue: int = 2, api_key: str | None = API_KEY) -> tuple[TestClient, GenerationQueue]:
    queue = GenerationQueue(max_queue)
    app = create_app(PairHolder(fake_pair(), queue=queue), queue, api_key)
    return TestClient(app, headers=AUTH if api_key else {}), queue
