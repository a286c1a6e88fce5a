"""A client that leaves frees the pair within a round (app/serve/stream.py), counted on a fake
pair rather than timed on a real one (issue 43: tests/test_serve_real.py says the same of the
real server without a time bound)."""
from __future__ import annotations

import anyio

from app.runtime.queue import GenerationQueue
from app.runtime.request import Offer
from app.serve.parsing import parse_chat
from app.serve.routes import fitted_tokens, prepared
from app.serve.responses import Formatter
from app.serve.stream import Job, run_to_end, stream_events
from tests.serve_fakes import fake_pair

OFFER = Offer(("plain", "draft", "hybrid", "lookup"), "hybrid")
MAX_TOKENS = 200


def _request(stream: bool = False):
    pair = fake_pair()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS,
            "speculative": {"drafter": "plain"}, "stream": stream}
    req = prepared(pair, parse_chat(body, OFFER))
    return pair, req, fitted_tokens(pair, req)[0]


def _answer(leaves_after: int | None) -> tuple[object, int, GenerationQueue]:
    """A whole answer of up to MAX_TOKENS plain tokens (one target call a round), whose client
    is gone from its `leaves_after`-th look on (None: never). Returns what run_to_end gave, the
    target's calls after the prompt, and the queue."""
    pair, req, tokens = _request()
    queue = GenerationQueue()
    looks = 0

    async def gone() -> bool:
        nonlocal looks
        looks += 1
        return leaves_after is not None and looks >= leaves_after

    backend = pair.target.backend
    before = len(backend.calls)
    done = anyio.run(run_to_end, Job(pair, req, queue, tokens), gone)
    return done, len(backend.calls) - before, queue


def test_a_client_that_gives_up_on_a_whole_answer_frees_the_pair_within_a_round():
    done, calls, queue = _answer(leaves_after=3)
    # Two rounds ran, and the third's look found the client gone: the prompt and three rounds
    # at most, not MAX_TOKENS; the queue's slot is free.
    assert done is None and calls <= 4
    assert queue.snapshot()["running"] == 0


def test_a_client_that_stays_gets_the_whole_answer():
    """The control: the same answer, with its client there, runs to MAX_TOKENS."""
    done, calls, queue = _answer(leaves_after=None)
    assert done is not None and len(done.tokens) == MAX_TOKENS and calls > MAX_TOKENS // 2
    assert queue.snapshot()["running"] == 0


def _stream(chunks: int | None) -> tuple[int, int, GenerationQueue]:
    """A streamed answer read for `chunks` chunks, then closed as Starlette closes it when the
    client leaves (None: read to the end). Returns the chunks read, the target's calls after the
    prompt, and the queue."""
    pair, req, tokens = _request(stream=True)
    queue = GenerationQueue()
    job = Job(pair, req, queue, tokens)
    fmt = Formatter(req, "fake", pair.target.backend.token_bytes)
    backend = pair.target.backend
    before = len(backend.calls)
    read = 0

    async def client() -> None:
        nonlocal read
        events = stream_events(job, fmt)
        try:
            async for _ in events:
                read += 1
                if chunks is not None and read == chunks:
                    break
        finally:
            await events.aclose()
            job.close()

    anyio.run(client)
    return read, len(backend.calls) - before, queue


def test_a_client_that_leaves_mid_stream_frees_the_pair_within_a_round():
    read, calls, queue = _stream(chunks=4)
    # The role chunk and three tokens: the prompt and four rounds at most, not MAX_TOKENS.
    assert read == 4 and calls <= 5
    assert queue.snapshot()["running"] == 0


def test_a_client_that_reads_the_stream_to_the_end_gets_every_token():
    """The control: the same stream, read to the end, ran MAX_TOKENS rounds."""
    read, calls, queue = _stream(chunks=None)
    assert read > MAX_TOKENS // 2 and calls > MAX_TOKENS // 2
    assert queue.snapshot()["running"] == 0
