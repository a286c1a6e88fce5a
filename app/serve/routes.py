"""The API's routes: /health, /v1/models (the loaded pair: the target it is served as, its
draft and drafters), /v1/chat/completions, /v1/completions, and an OpenAI-style 404 for any
other /v1 path.

The routes live on an APIRouter so the same routes serve alone (`tandem serve`) or mounted on
the FastAPI app Gradio runs (`tandem ui --api`). Errors are answered inside each route, not by
app-wide exception handlers, so mounting them leaves Gradio's own error handling alone.
"""
from __future__ import annotations

import functools
import hmac
import logging
from typing import Awaitable, Callable

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.serve.errors import (AuthError, NotFoundError, TooLargeError, UnavailableError,
                              as_api_error)
from app.serve.parsing import GenerationRequest, parse_chat, parse_completion, parse_json
from app.runtime.queue import GenerationQueue, QueueFullError
from app.serve.responses import Formatter, model_id
from app.serve.stream import ClosingStreamingResponse, Job, run_to_end, stream_events
from app.runtime.holder import READY, NotReadyError, PairHolder
from engine.pair import Pair

log = logging.getLogger("tandem.serve")

# Bodies larger than this are refused (413) before they are parsed: far more text than any
# context this server runs holds.
MAX_BODY_BYTES = 8 * 1024 * 1024

Handler = Callable[[Request], Awaitable[Response]]


def api_router(holder: PairHolder, queue: GenerationQueue, api_key: str | None = None) -> APIRouter:
    router = APIRouter()

    def answered(handler: Handler) -> Handler:
        """Run a route; any error becomes an OpenAI-style JSON error with its status."""
        @functools.wraps(handler)
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - no request may take the server down
                error = as_api_error(exc)
                if error.status >= 500:
                    log.exception("request failed")
                return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
        return route

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if not given:
            raise AuthError("missing API key: send the header 'Authorization: Bearer KEY'")
        # Constant-time comparison: the key must not leak through response times.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise AuthError("wrong API key")

    def loaded_pair() -> Pair:
        try:
            return holder.pair
        except NotReadyError as exc:
            raise UnavailableError(str(exc), headers={"Retry-After": "5"}) from None

    async def read_body(request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise TooLargeError(f"the request body ({declared} bytes) is larger than "
                                f"{MAX_BODY_BYTES} bytes", code="request_too_large")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise TooLargeError(f"the request body is larger than {MAX_BODY_BYTES} bytes",
                                code="request_too_large")
        return parse_json(body)

    def check_model(pair: Pair, wanted: str | None) -> str:
        served = model_id(pair.target.backend.name)
        if wanted is not None and wanted != served:
            raise NotFoundError(f"model {wanted!r} is not served here; this server serves "
                                f"{served!r}", param="model", code="model_not_found")
        return served

    def check_fits(pair: Pair, req: GenerationRequest) -> None:
        n_ctx = pair.target.backend.n_ctx
        n = len(pair.tokens_for(req.prompt, raw=req.raw))
        # The engine needs one free position to decode the first new token.
        if n + 1 > n_ctx:
            raise TooLargeError(f"the prompt is {n} tokens; the context holds {n_ctx} "
                                "(restart with a larger --ctx or shorten the prompt)",
                                param="messages" if req.kind == "chat" else "prompt")

    async def generation(request: Request, parse) -> Response:
        authorize(request)
        body = await read_body(request)
        pair = loaded_pair()
        req = parse(body, pair.drafters, pair.default_drafter)
        served = check_model(pair, req.model)
        await to_thread.run_sync(check_fits, pair, req)
        try:
            job = Job(pair, req, queue)
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
        # Open without a key: it tells a supervisor whether the process serves, nothing more.
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
        authorize(request)
        pair = loaded_pair()
        served = model_id(pair.target.backend.name)
        draft = pair.draft_backend.name if pair.draft_backend is not None else None
        return JSONResponse({"object": "list", "data": [
            {"id": served, "object": "model", "created": 0, "owned_by": "tandem",
             "pair": {"target": pair.target.backend.name, "draft": draft},
             "drafters": pair.drafters, "default_drafter": pair.default_drafter}]})

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
        authorize(request)
        raise NotFoundError(f"no route {request.method} {request.url.path} on this server "
                            "(it serves /v1/models, /v1/chat/completions, /v1/completions)",
                            code="unknown_url")

    return router
