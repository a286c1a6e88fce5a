"""The API's routes: /health, /v1/models (the loaded pair: the target it is served as, its
draft and drafters), /v1/chat/completions, /v1/completions, and an OpenAI-style 404 for any
other /v1 path.

The routes live on an APIRouter so the same routes serve alone (`tandem serve`) or beside the
Gradio app (`tandem ui --api`). Errors are answered inside each route, not by app-wide exception
handlers, so mounting them leaves Gradio's own error handling alone. Who may call them (Host,
Origin, key) is checked before any route runs (guard.py).
"""
from __future__ import annotations

import functools
import logging
from typing import AsyncIterator, Awaitable, Callable

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from app.serve.errors import (BadRequestError, InternalError, NotFoundError, TooLargeError,
                              UnavailableError, UnsupportedMediaError, as_api_error)
from app.serve.parsing import GenerationRequest, parse_chat, parse_completion, parse_json
from app.runtime.queue import GenerationQueue, QueueFullError
from app.serve.responses import Formatter, model_id
from app.serve.stream import ClosingStreamingResponse, Job, run_to_end, stream_events
from app.serve.access import bearer_token
from loading.history import LOCAL, owner_for_key
from app.runtime.holder import READY, NotReadyError, PairHolder
from engine.pair import Pair

log = logging.getLogger("tandem.serve")

# Bodies larger than this are refused (413) before they are parsed: far more text than any
# context this server runs holds.
MAX_BODY_BYTES = 8 * 1024 * 1024
# A refused body is still read (and dropped) up to this much before the answer, so a client that
# sends its whole body before reading gets the 413 instead of a reset connection.
MAX_DRAIN_BYTES = 64 * 1024 * 1024
# The one media type of a request body: a web page can send text/plain or a form to any server
# without asking first (a CORS "simple request"), but not JSON.
JSON_MEDIA_TYPE = "application/json"

Handler = Callable[[Request], Awaitable[Response]]


def history_owner(request: Request) -> str:
    """Whose history a request uses: its API key's (by hash), else the local one."""
    key = bearer_token(request.headers.get("authorization"))
    return owner_for_key(key) if key else LOCAL


def api_router(holder: PairHolder, queue: GenerationQueue) -> APIRouter:
    router = APIRouter()

    def answered(handler: Handler) -> Handler:
        """Run a route; any error becomes an OpenAI-style JSON error with its status."""
        @functools.wraps(handler)
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except ClientDisconnect:
                # Gone while sending its body: nobody reads an answer.
                return Response(status_code=499)
            except Exception as exc:  # noqa: BLE001 - no request may take the server down
                error = as_api_error(exc)
                if isinstance(error, InternalError):
                    log.exception("request failed")
                elif error.status >= 500:
                    # Busy or still loading: expected, and said in one line.
                    log.warning("%s %s: %s", request.method, request.url.path, error)
                return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
        return route

    def loaded_pair() -> Pair:
        try:
            return holder.pair
        except NotReadyError as exc:
            raise UnavailableError(str(exc), headers={"Retry-After": "5"}) from None

    async def read_body(request: Request) -> dict:
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != JSON_MEDIA_TYPE:
            raise UnsupportedMediaError(f"the request body must be JSON sent with 'Content-Type: "
                                        f"{JSON_MEDIA_TYPE}', got {media or 'no Content-Type'!r}")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            # Refused from the header, before any of it is kept. A client that asked to
            # continue first (`Expect: 100-continue`) waits for this answer and sends nothing.
            if "100-continue" not in request.headers.get("expect", "").lower():
                await drain(request.stream(), 0)
            raise TooLargeError(f"the request body ({declared} bytes) is larger than "
                                f"{MAX_BODY_BYTES} bytes", code="request_too_large")
        body = bytearray()
        chunks = request.stream()
        async for chunk in chunks:
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                await drain(chunks, len(body))
                raise TooLargeError(f"the request body is larger than {MAX_BODY_BYTES} bytes",
                                    code="request_too_large")
        return parse_json(bytes(body))

    def check_model(pair: Pair, wanted: str | None) -> str:
        served = model_id(pair.target.backend.name)
        if wanted is not None and wanted != served:
            raise NotFoundError(f"model {wanted!r} is not served here; this server serves "
                                f"{served!r}", param="model", code="model_not_found")
        return served

    def check_max_tokens(pair: Pair, body: dict) -> None:
        """An answer length the context can never hold is refused, not silently cut (one that
        fits the context alone, but not after the prompt, still ends at the context's end)."""
        name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        asked, n_ctx = body.get(name), pair.target.backend.n_ctx
        if asked is not None and asked > n_ctx:
            raise BadRequestError(f"{name} must be at most {n_ctx}, the tokens the context holds "
                                  f"in all (--ctx), got {asked}", param=name)

    def check_fits(pair: Pair, req: GenerationRequest) -> None:
        n_ctx = pair.target.backend.n_ctx
        n = len(pair.tokens_for(req.prompt, raw=req.raw))
        # The engine needs one free position to decode the first new token.
        if n + 1 > n_ctx:
            raise TooLargeError(f"the prompt is {n} tokens; the context holds {n_ctx} "
                                "(restart with a larger --ctx or shorten the prompt)",
                                param="messages" if req.kind == "chat" else "prompt")

    async def generation(request: Request, parse) -> Response:
        body = await read_body(request)
        pair = loaded_pair()
        req = parse(body, pair.drafters, pair.default_drafter)
        served = check_model(pair, req.model)
        check_max_tokens(pair, body)
        await to_thread.run_sync(check_fits, pair, req)
        try:
            # Each API key drafts from, and adds to, a history of its own.
            job = Job(pair, req, queue, holder.history_for(history_owner(request)))
        except QueueFullError as exc:
            raise UnavailableError(str(exc), code="queue_full",
                                   headers={"Retry-After": str(exc.retry_after)}) from None
        fmt = Formatter(req, served)
        if req.stream:
            return ClosingStreamingResponse(stream_events(job, fmt), job.close,
                                            media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache"})
        done = await run_to_end(job, request.is_disconnected)
        if done is None:
            # The client is gone; nobody reads this answer.
            return Response(status_code=499)
        return JSONResponse(fmt.response(done.text, done.stats))

    @router.get("/health")
    @answered
    async def health(request: Request) -> Response:
        # Open without a key (access.py OPEN_PATHS).
        status = holder.status
        ready = status.state == READY
        body = {"status": "ok" if ready else status.state, "message": status.message,
                "queue": queue.snapshot()}
        if ready:
            body["model"] = model_id(holder.pair.target.backend.name)
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get("/v1/models")
    @answered
    async def models(request: Request) -> Response:
        pair = loaded_pair()
        served = model_id(pair.target.backend.name)
        draft = pair.draft_backend.name if pair.draft_backend is not None else None
        return JSONResponse({"object": "list", "data": [
            {"id": served, "object": "model", "created": 0, "owned_by": "tandem",
             "pair": {"target": pair.target.backend.name, "draft": draft},
             "drafters": pair.drafters, "default_drafter": pair.default_drafter,
             "offload": holder.offload.as_dict() if holder.offload is not None else None}]})

    @router.post("/v1/chat/completions")
    @answered
    async def chat_completions(request: Request) -> Response:
        return await generation(request, parse_chat)

    @router.post("/v1/completions")
    @answered
    async def completions(request: Request) -> Response:
        return await generation(request, parse_completion)

    @router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    @answered
    async def unknown(request: Request) -> Response:
        raise NotFoundError(f"no route {request.method} {request.url.path} on this server "
                            "(it serves /v1/models, /v1/chat/completions, /v1/completions)",
                            code="unknown_url")

    return router


async def drain(chunks: AsyncIterator[bytes], seen: int) -> None:
    """Read and drop what is left of a refused body, up to MAX_DRAIN_BYTES in all."""
    try:
        async for chunk in chunks:
            seen += len(chunk)
            if seen > MAX_DRAIN_BYTES:
                return
    except ClientDisconnect:
        return
