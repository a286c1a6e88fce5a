"""Running one admitted request on the pair from the event loop.

The engine is synchronous and holds the pair's lock while its generator is open, so each step
runs in a worker thread and the generator is closed as soon as the request ends, whatever
ends it: the answer is complete, the client disconnected (Starlette cancels the response),
or an error. Closing it releases the pair at the next round; then the queue place is given
back. A step is never interrupted halfway: anyio lets a worker thread finish before the
cancellation lands, so the engine's caches are never left mid-decode.
"""
from __future__ import annotations

import logging
from contextlib import aclosing
from typing import AsyncIterator, Awaitable, Callable, Generator, Sequence

from anyio import to_thread
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.serve.errors import as_api_error
from app.serve.parsing import GenerationRequest
from app.runtime.queue import GenerationQueue
from app.runtime.run import generate
from app.serve.responses import Formatter
from app.serve.responses_objects import ResponsesFormatter
from app.runtime.reasoning import thought_tokens
from app.runtime.tool_reading import Content
from engine.events import DoneEvent, Event, RoundEvent, TokenEvent
from engine.logprobs import TokenLogprob
from engine.pair import Pair
from loading.history import History

log = logging.getLogger("tandem.serve")

# How often a waiting request looks whether its client is still there, in seconds.
WAIT_STEP_S = 0.25


class Job:
    """One request that holds a queue ticket: waits its turn, runs, and gives the ticket back."""

    def __init__(self, pair: Pair, request: GenerationRequest, queue: GenerationQueue,
                 tokens: Sequence[int], history: History | None = None) -> None:
        self.pair = pair
        self.request = request
        self.queue = queue
        # The prompt's tokens, counted once when the request was admitted (app/runtime/run.py).
        self.tokens = tokens
        # The caller's history of past requests (one per API key), None when off.
        self.history = history if request.spec.history else None
        self.ticket: int | None = queue.join()

    async def turn(self, gone: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Wait for the slot; False when the client left first."""
        while not await to_thread.run_sync(self.queue.wait, self.ticket, WAIT_STEP_S):
            if gone is not None and await gone():
                return False
        return True

    async def events(self) -> AsyncIterator[Event]:
        """The engine's events, one worker-thread step at a time; closes the engine's
        generator (and so frees the pair) however the iteration ends."""
        events = await to_thread.run_sync(self._start)
        try:
            while True:
                event = await to_thread.run_sync(next, events, None)
                if event is None:
                    return
                if isinstance(event, DoneEvent) and self.history is not None:
                    # The engine added the prompt and answer before it said it was done.
                    await to_thread.run_sync(self.history.save)
                yield event
        finally:
            events.close()

    def _start(self) -> Generator[Event, None, None]:
        # Started with the slot held: the adaptive policy calibrates under the pair's lock.
        return generate(self.pair, self.request.spec, self.tokens,
                        self.history.index if self.history else None, self.request.prediction)

    def close(self) -> None:
        if self.ticket is not None:
            self.queue.leave(self.ticket)
            self.ticket = None


async def run_to_end(job: Job, gone: Callable[[], Awaitable[bool]],
                     logprobs: list[TokenLogprob] | None = None) -> DoneEvent | None:
    """The whole generation, or None when the client disconnected (checked every round); the
    tokens' log probabilities, when asked for, are added to `logprobs`."""
    try:
        if not await job.turn(gone):
            return None
        async with aclosing(job.events()) as events:
            async for event in events:
                if isinstance(event, TokenEvent) and event.logprob is not None \
                        and logprobs is not None:
                    logprobs.append(event.logprob)
                if isinstance(event, DoneEvent):
                    return event
                if isinstance(event, RoundEvent) and await gone():
                    return None
        return None
    finally:
        job.close()


async def stream_events(job: Job, fmt: Formatter | ResponsesFormatter) -> AsyncIterator[str]:
    """Server-sent events in the formatter's shape (chat and completions chunks, or the
    Responses API's events): the opening, the text as it is committed (or, with tools, each
    tool call's name, then its arguments), then the end and the statistics. Each token's log
    probability rides on the first chunk sent after it was committed. An error after the
    headers went out becomes an error event."""
    reader = fmt.reader()
    pending: list[TokenLogprob] = []
    try:
        await job.turn()
        yield fmt.opening()
        async with aclosing(job.events()) as events:
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.logprob is not None:
                        pending.append(event.logprob)
                    if not event.text:
                        continue
                    pieces = reader.push(event.text) if reader else [Content(event.text)]
                    for piece in pieces:
                        yield fmt.piece(piece, pending)
                        pending = []
                elif isinstance(event, DoneEvent):
                    for piece in reader.finish() if reader else ():
                        yield fmt.piece(piece, pending)
                        pending = []
                    yield fmt.closing(event.stats, pending, thought_tokens(
                        job.request.thinking, event.text, event.tokens,
                        job.pair.target.backend.token_bytes))
    except Exception as exc:  # noqa: BLE001 - the status line is sent; tell the client in-band
        error = as_api_error(exc)
        if error.status >= 500:
            log.exception("generation failed")
        yield fmt.failure(error.body())
    finally:
        job.close()


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that always closes its body iterator and then runs `cleanup`:
    when the client disconnects while a chunk is being sent, Starlette cancels the response
    outside the iterator, which would otherwise stay suspended (holding the pair) until garbage
    collection; and an iterator that never started has no finally of its own to run."""

    def __init__(self, content: AsyncIterator[str], cleanup: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            finally:
                self.cleanup()
