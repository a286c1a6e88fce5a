"""Serving a FastAPI app of ours over HTTP: the API alone (`tandem serve`), or the page with the
API beside it (`tandem ui [--api]`). Every app is built here with the guard
outermost (guard.py), and its socket is bound before serving, so a taken port is a one-line
error instead of a log record from a background thread.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from app.serve.access import Access, display_url
from app.serve.errors import APIError
from app.serve.guard import Guard
from app.serve.openapi import document
from app.runtime.queue import GenerationQueue
from app.serve.routes import api_router
from app.runtime.holder import PairHolder
from engine.errors import SettingsError

# Seconds open responses get to finish once the server is told to stop.
GRACEFUL_S = 5
# How long a background server may take to start listening.
START_TIMEOUT_S = 60


def guarded_app(access: Access) -> FastAPI:
    """An empty app with the guard in front of everything it will serve."""
    # No generated docs: every route below answers OpenAI-style JSON, the docs pages would not.
    return FastAPI(title="Tandem", docs_url=None, redoc_url=None, openapi_url=None,
                   middleware=[Middleware(Guard, access=access)])


def create_app(holder: PairHolder, queue: GenerationQueue, access: Access) -> FastAPI:
    """The API alone (`tandem serve`), with its OpenAPI document at /openapi.json."""
    app = guarded_app(access)
    app.include_router(api_router(holder, queue))
    schema = document()
    app.add_api_route("/openapi.json", lambda: JSONResponse(schema), methods=["GET"],
                      include_in_schema=False)
    # A path or method no route takes is answered by the framework (404, 405): in the same
    # OpenAI-style body as every other error. (Only here: beside the page, Gradio answers its own.)
    app.add_exception_handler(HTTPException, framework_error)
    return app


async def framework_error(request: Request, exc: Exception) -> JSONResponse:
    """404 and 405 from the framework, in the API's error body."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else type(exc).__name__
    code = {404: "unknown_url", 405: "method_not_allowed"}.get(status, "http_error")
    error = APIError(f"{detail}: {request.method} {request.url.path} (this server serves /health, "
                     "/v1/models, /v1/chat/completions, /v1/completions, /v1/responses)",
                     code=code)
    return JSONResponse(error.body(), status_code=status,
                        headers=getattr(exc, "headers", None) or {})


def launch(mount_page: Callable[[FastAPI, str, int], None], access: Access,
           api: APIRouter | None = None) -> Running:
    """Serve the page on `access.host`:`access.port` without blocking, with the `api` routes
    beside it. `mount_page(app, host, port)` puts the page on our app (app/ui's `page_mounter`;
    the API never imports the page): Gradio is mounted, not launched on its own, so the guard
    is the outermost layer (Gradio's launch puts its own CORS handling in front of anything
    added)."""
    app = guarded_app(access)
    if api is not None:
        app.include_router(api)
    mount_page(app, access.host, access.port)
    return Running(app, listen(access.host, access.port), display_url(access.host, access.port))


def listen(host: str, port: int) -> socket.socket:
    """The bound socket, or a one-line error naming the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except (OSError, OverflowError) as exc:
        sock.close()
        reason = getattr(exc, "strerror", None) or str(exc)
        raise SettingsError(f"cannot listen on {host}:{port}: {reason} (pick another --port, or "
                            "--host an address of this machine)") from None
    return sock


def _server(app: FastAPI) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                         timeout_graceful_shutdown=GRACEFUL_S))


def run(app: FastAPI, sock: socket.socket) -> None:
    """Serve on `sock` until Ctrl-C; uvicorn handles the signal and finishes open responses."""
    _server(app).run(sockets=[sock])


class Running:
    """A server serving in a background thread (the app's: the main thread waits for Ctrl-C)."""

    def __init__(self, app: FastAPI, sock: socket.socket, url: str) -> None:
        self.url = url
        self.server = _server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="tandem-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.server.started:
            self.close()
            raise SettingsError("the HTTP server did not start")

    def wait(self) -> None:
        """Block until the server stops; Ctrl-C stops it."""
        try:
            while self.thread.is_alive():
                self.thread.join(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
        finally:
            self.close()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(GRACEFUL_S + 5)
