"""The API's routes: /health, /v1/models (the loaded pair: the target it is served as, its
draft and drafters), /v1/chat/completions, /v1/completions, /v1/responses (OpenAI's Responses
API, read as the chat request it amounts to), and an OpenAI-style 404 for any other /v1 path.

The routes live on an APIRouter so the same routes serve alone (`tandem serve`) or beside the
Gradio app (`tandem ui --api`). Errors are answered inside each route, not by app-wide exception
handlers, so mounting them leaves Gradio's own error handling alone. Who may call them (Host,
Origin, key) is checked before any route runs (guard.py).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import AsyncIterator, Awaitable, Callable

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from app.serve.errors import (BadRequestError, InternalError, NotFoundError, TooLargeError,
                              UnavailableError, UnsupportedMediaError, as_api_error)
from app.runtime.reasoning import after_thinking, content_only, thinking_for, thought_tokens
from app.runtime.request import Offer, RunSpec
from app.runtime.overflow import STOP, fit, reserve
from app.runtime.ranges import SpecError
from app.runtime.run import prediction_tokens, prompt_tokens
from app.runtime.tool_calls import Tools, prompt_with_tools, template_syntax
from app.runtime.tool_syntax import Syntax, as_read
from app.runtime.tool_grammar import control_tokens, tool_grammar
from app.runtime.tool_reading import ends_calls
from app.serve.parsing import GenerationRequest, parse_chat, parse_completion, parse_json
from app.runtime.queue import GenerationQueue, QueueFullError
from app.serve.responses import Formatter, model_id
from app.serve.responses_kept import KeptResponses
from app.serve.responses_objects import ResponsesFormatter
from app.serve.stream import ClosingStreamingResponse, Job, run_to_end, stream_events
from app.serve.access import bearer_token
from loading.history import LOCAL, owner_for_key
from loading.responses import ResponseStore
from app.runtime.holder import READY, NotReadyError, PairHolder
from engine.errors import GrammarError, PromptTooLongError
from engine.grammar.llg import compile_grammar
from engine.grammar.spec import GrammarSpec
from engine.logprobs import TokenLogprob
from engine.backend import Backend
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

# The header that tells a request with a `context_overflow` policy how many of its messages
# the policy left out to fit the context.
DROPPED_HEADER = "X-Tandem-Dropped-Messages"

Handler = Callable[[Request], Awaitable[Response]]
Parse = Callable[[dict, Offer], GenerationRequest]


def history_owner(request: Request) -> str:
    """Whose history a request uses: its API key's (by hash), else the local one."""
    key = bearer_token(request.headers.get("authorization"))
    return owner_for_key(key) if key else LOCAL


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


async def read_body(request: Request) -> dict:
    """The JSON object a request sends, refused (415, 413) before parsing when it is not JSON
    or too large."""
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


def served_model(pair: Pair) -> str:
    """The id the pair is served as. A request's `model` may name any model, as llama-server
    allows: some clients send a fixed name, and one pair is served whatever it says; the
    answer's `model` says which."""
    return model_id(pair.target.backend.name)


def fitted_tokens(pair: Pair, req: GenerationRequest) -> tuple[list[int], int]:
    """The prompt's tokens, the one time they are counted, and how many messages the
    request's overflow policy left out; 413 when the context cannot hold them (the engine's
    rule, app/runtime/run.py, or the policy's: app/runtime/overflow.py)."""
    try:
        if req.overflow == STOP or req.kind != "chat":
            return prompt_tokens(pair, req.spec), 0
        spec = req.spec
        room = pair.n_ctx - reserve(spec.max_tokens, pair.n_ctx)
        fitted = fit(list(spec.prompt), req.overflow,
                     lambda messages: pair.tokens_for(messages, tools=spec.tools or None), room)
        return fitted.tokens, len(fitted.dropped)
    except PromptTooLongError as exc:
        raise TooLargeError(str(exc), param="messages" if req.kind == "chat" else "prompt") from None


def fitted_prediction(pair: Pair, req: GenerationRequest, n_prompt: int) -> GenerationRequest:
    """The request with its prediction's tokens, counted once; 400 naming `prediction` when the
    context cannot hold them after the prompt's `n_prompt`."""
    try:
        return replace(req, prediction=tuple(prediction_tokens(pair, req.spec, n_prompt)))
    except SpecError as exc:
        raise BadRequestError(str(exc), param="prediction") from None


def prepared(pair: Pair, req: GenerationRequest) -> GenerationRequest:
    """The request made ready for this pair: the tools rendered for the target's chat template
    (natively, or the Hermes fallback) with the grammar of its call syntax, and any grammar
    compiled now, so a schema the constraint engine refuses is a 400 with its message before
    the request is queued (the generation finds it compiled: the pair keeps the last few)."""
    spec = req.spec
    offered = req.tools is not None and req.tools.offered
    if req.tools is not None:
        backend = pair.target.backend
        if req.kind == "chat":
            shown = prompt_with_tools(backend, spec.prompt, req.tools)
            spec = replace(spec, prompt=shown.messages, tools=shown.entries)
            syntax = shown.syntax
        else:
            syntax = _completion_syntax(backend, req.tools)
        tokens = control_tokens(backend, syntax)
        grammar = tool_grammar(syntax, req.tools, tokens)
        # Read in the text as it shows: a control token written as nothing is not in it.
        syntax = as_read(syntax, {p for p, t in tokens.items() if not backend.token_bytes(t)})
        spec = replace(spec, grammar=grammar or spec.grammar,
                       until=ends_calls(syntax, req.tools) if offered else None)
        req = replace(req, syntax=syntax)
    spec, req = _thought(pair.target.backend, spec, req)
    if spec.grammar is not None:
        try:
            pair.compile_grammar(spec.grammar)
        except GrammarError as exc:
            if offered:
                raise _refused_tool(pair, req) or _refusal(exc, "tools") from None
            raise _refusal(exc, "response_format") from None
    return replace(req, spec=spec)


def _thought(backend: Backend, spec: RunSpec,
             req: GenerationRequest) -> tuple[RunSpec, GenerationRequest]:
    """A chat with a model that thinks (app/runtime/reasoning.py): its answer is split, and
    its grammar and its calls' end are read after the thinking."""
    thinking = thinking_for(backend, req.reasoning_format) if req.kind == "chat" else None
    if thinking is None:
        return spec, req
    spec = replace(spec, grammar=after_thinking(spec.grammar, thinking, backend),
                   until=content_only(spec.until, thinking) if spec.until else None)
    return spec, replace(req, thinking=thinking)


def _completion_syntax(backend: Backend, tools: Tools) -> Syntax:
    """Tools on /v1/completions: the prompt is the caller's (it describes the tools), the
    syntax the template's; 400 when the template does not read tools."""
    syntax = template_syntax(backend, tools)
    if syntax is None:
        raise BadRequestError(f"tools on /v1/completions need a chat template that reads tools, "
                              f"and {backend.name}'s does not; use /v1/chat/completions",
                              param="tools")
    return syntax


def _refusal(exc: GrammarError, param: str) -> BadRequestError:
    """The constraint engine's message (one line: engine/grammar/llg.py)."""
    return BadRequestError(str(exc), param=param, code="invalid_schema")


def _refused_tool(pair: Pair, req: GenerationRequest) -> BadRequestError | None:
    """The refusal of the first tool whose parameters the constraint engine refuses alone (run
    only once the tools' grammar was refused)."""
    for i, function in enumerate(req.tools.functions if req.tools else ()):
        try:
            compile_grammar(GrammarSpec.schema(function.parameters), pair.target.backend)
        except GrammarError as exc:
            return _refusal(exc, f"tools[{i}].function.parameters")
    return None


class Routes:
    """The handlers over one holder's pair and the queue its generations take turns from."""

    def __init__(self, holder: PairHolder, queue: GenerationQueue) -> None:
        self.holder = holder
        self.queue = queue
        self.stored = ResponseStore()

    def loaded_pair(self) -> Pair:
        try:
            return self.holder.pair
        except NotReadyError as exc:
            raise UnavailableError(str(exc), headers={"Retry-After": "5"}) from None

    async def generation(self, request: Request, parse: Parse,
                         responses: KeptResponses | None = None) -> Response:
        """One generation: chat or completions (`parse`), or the Responses API's."""
        body = await read_body(request)
        pair = self.loaded_pair()
        req = parse(body, self.holder.offer())
        req = replace(req, reasoning_format=req.reasoning_format or self.holder.reasoning_format)
        served = served_model(pair)
        # Compiling a grammar reads the vocabulary once per model (about a second for Qwen's).
        req = await to_thread.run_sync(prepared, pair, req)
        tokens, dropped = await to_thread.run_sync(fitted_tokens, pair, req)
        req = await to_thread.run_sync(fitted_prediction, pair, req, len(tokens))
        # Said only to a request that chose a policy: how many messages it left out.
        context = {} if req.overflow == STOP else {DROPPED_HEADER: str(dropped)}
        try:
            # Each API key drafts from, and adds to, a history of its own.
            job = Job(pair, req, self.queue, tokens,
                      self.holder.history_for(history_owner(request)))
        except QueueFullError as exc:
            raise UnavailableError(str(exc), code="queue_full",
                                   headers={"Retry-After": str(exc.retry_after)}) from None
        fmt = (ResponsesFormatter(req, body, served, responses) if responses is not None
               else Formatter(req, served, pair.target.backend.token_bytes))
        if req.stream:
            return ClosingStreamingResponse(stream_events(job, fmt), job.close,
                                            media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache", **context})
        logprobs: list[TokenLogprob] = []
        done = await run_to_end(job, request.is_disconnected, logprobs)
        if done is None:
            # The client is gone; nobody reads this answer.
            return Response(status_code=499)
        thought = thought_tokens(req.thinking, done.text, done.tokens, pair.target.backend.token_bytes)
        return JSONResponse(fmt.response(done.text, done.stats, logprobs, thought),
                            headers=context)

    async def health(self, request: Request) -> Response:
        # Open without a key (access.py OPEN_PATHS).
        status = self.holder.status
        ready = status.state == READY
        body = {"status": "ok" if ready else status.state, "message": status.message,
                "queue": self.queue.snapshot()}
        if ready:
            body["model"] = model_id(self.holder.pair.target.backend.name)
        return JSONResponse(body, status_code=200 if ready else 503)

    async def models(self, request: Request) -> Response:
        pair = self.loaded_pair()
        offer = self.holder.offer()
        draft = pair.draft_backend.name if pair.draft_backend is not None else None
        return JSONResponse({"object": "list", "data": [
            {"id": model_id(pair.target.backend.name), "object": "model", "created": 0,
             "owned_by": "tandem", "pair": {"target": pair.target.backend.name, "draft": draft},
             "drafters": list(offer.drafters), "default_drafter": offer.drafter,
             "offload": (self.holder.offload.as_dict() if self.holder.offload is not None
                         else None),
             "settings": (self.holder.settings.as_dict() if self.holder.settings is not None
                          else None)}]})

    async def chat_completions(self, request: Request) -> Response:
        return await self.generation(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self.generation(request, parse_completion)

    def kept(self, request: Request) -> KeptResponses:
        """The stored responses of the request's key (app/serve/responses_kept.py)."""
        return KeptResponses(self.stored, history_owner(request))

    async def responses(self, request: Request) -> Response:
        kept = self.kept(request)
        return await self.generation(request, kept.parse, responses=kept)

    async def stored_response(self, request: Request) -> Response:
        kept, response_id = self.kept(request), request.path_params["response_id"]
        if request.method == "DELETE":
            return JSONResponse(await to_thread.run_sync(kept.delete, response_id))
        return JSONResponse(await to_thread.run_sync(kept.get, response_id))

    async def unknown(self, request: Request) -> Response:
        raise NotFoundError(f"no route {request.method} {request.url.path} on this server "
                            "(it serves /v1/models, /v1/chat/completions, /v1/completions, /v1/responses)",
                            code="unknown_url")


def api_router(holder: PairHolder, queue: GenerationQueue) -> APIRouter:
    routes = Routes(holder, queue)
    router = APIRouter()
    router.add_api_route("/health", answered(routes.health), methods=["GET"])
    router.add_api_route("/v1/models", answered(routes.models), methods=["GET"])
    router.add_api_route("/v1/chat/completions", answered(routes.chat_completions),
                         methods=["POST"])
    router.add_api_route("/v1/completions", answered(routes.completions), methods=["POST"])
    router.add_api_route("/v1/responses", answered(routes.responses), methods=["POST"])
    router.add_api_route("/v1/responses/{response_id}", answered(routes.stored_response),
                         methods=["GET", "DELETE"])
    router.add_api_route("/v1/{path:path}", answered(routes.unknown),
                         methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
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
