"""The API as a FastAPI app of its own (`tandem serve`), or mounted on the FastAPI app the
Gradio page already runs on (`tandem ui --api`), sharing its pair holder and queue."""
from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from app.runtime.queue import GenerationQueue
from app.serve.routes import api_router
from app.runtime.holder import PairHolder


def create_app(holder: PairHolder, queue: GenerationQueue, api_key: str | None = None) -> FastAPI:
    # No generated docs: every route below answers OpenAI-style JSON, the docs pages would not.
    app = FastAPI(title="Tandem", docs_url=None, redoc_url=None, openapi_url=None)
    mount(app, holder, queue, api_key)
    return app


def mount(app: FastAPI, holder: PairHolder, queue: GenerationQueue, api_key: str | None = None) -> None:
    """Add the API's routes to `app` (Gradio's, or our own)."""
    app.include_router(api_router(holder, queue, api_key))


def run(app: FastAPI, host: str, port: int) -> None:
    """Serve until Ctrl-C; uvicorn handles the signal and finishes open responses."""
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                  timeout_graceful_shutdown=5)).run()
