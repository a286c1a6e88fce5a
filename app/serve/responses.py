"""The engine's results as OpenAI objects: whole responses, stream chunks, usage, and the
`speculative` object that carries the generation's statistics.

Everything here formats what the engine measured (engine/stats.py); nothing is estimated.
`controller` holds the gamma of every round, the plain rounds, the policy's predictions, its
one-line reason for the latest round's gamma and what it knew then (costs, predicted speedups).
"""
from __future__ import annotations

import json
import time
import uuid

from app.serve.parsing import GenerationRequest
from engine.stats import GenerationStats

# The engine's finish reasons in OpenAI's words: an end-of-generation token or a stop string
# both end an answer normally.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
OBJECTS = {"chat": ("chat.completion", "chat.completion.chunk"),
           "completion": ("text_completion", "text_completion")}
ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


def model_id(file_name: str) -> str:
    """The id a model is served under: its file name without the .gguf suffix."""
    return file_name[:-5] if file_name.lower().endswith(".gguf") else file_name


class Formatter:
    """The OpenAI objects of one request: one id and creation time for all its chunks."""

    def __init__(self, request: GenerationRequest, model: str) -> None:
        self.request = request
        self.kind = request.kind
        self.model = model
        self.id = ID_PREFIX[self.kind] + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        return {"id": self.id, "object": OBJECTS[self.kind][int(chunk)], "created": self.created,
                "model": self.model}

    def _choice(self, text: str | None, finish: str | None, chunk: bool, first: bool = False) -> dict:
        if self.kind == "completion":
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if chunk:
            delta: dict = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    def response(self, text: str, stats: GenerationStats) -> dict:
        return {**self._head(False),
                "choices": [self._choice(text, finish_reason(stats), chunk=False)],
                "usage": usage(stats), "speculative": speculative(stats, self.request)}

    def opening(self) -> str:
        """A chat stream opens with the assistant's role, as OpenAI's does."""
        return sse({**self._head(True), "choices": [self._choice("", None, True, first=True)]})

    def delta(self, text: str) -> str:
        return sse({**self._head(True), "choices": [self._choice(text, None, True)]})

    def closing(self, stats: GenerationStats) -> str:
        """The finish reason, then the statistics chunk (no choices, like OpenAI's usage
        chunk), then the [DONE] line."""
        finish = {**self._head(True), "choices": [self._choice(None, finish_reason(stats), True)]}
        final: dict = {**self._head(True), "choices": []}
        if self.request.include_usage:
            final["usage"] = usage(stats)
        final["speculative"] = speculative(stats, self.request)
        return sse(finish) + sse(final) + DONE


DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def finish_reason(stats: GenerationStats) -> str:
    return FINISH_REASONS.get(stats.finish_reason, stats.finish_reason or "stop")


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.output_tokens,
            "total_tokens": stats.prompt_tokens + stats.output_tokens}


def speculative(stats: GenerationStats, request: GenerationRequest) -> dict:
    """The draft statistics of one generation, as measured by the engine."""
    report = stats.controller
    return {
        "mode": stats.mode,
        "drafter": request.spec.drafter,
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        # Per drafting part: the draft model, prompt lookup ("prompt-lookup"), the caller's
        # history of past requests ("suffix").
        "by_source": {k: {"drafted": v, "accepted": stats.accepted_by.get(k, 0)}
                      for k, v in stats.drafted_by.items()},
        "target_calls": stats.target_calls,
        "rounds": stats.rounds,
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "decode_ms": round(stats.decode_time_ms, 1),
        "ttft_ms": round(stats.ttft_ms, 1),
        "prefill_ms": round(stats.prefill_ms, 1),
        "total_ms": round(stats.total_time_ms, 1),
        "controller": {
            "policy": request.spec.policy,
            "max_gamma": stats.gamma,
            "gammas": list(stats.gammas),
            "plain_rounds": stats.gammas.count(0),
            # Tokens/s the policy expected of each round when it chose its gamma (None for
            # policies that predict nothing).
            "predicted_tps": [None if p is None else round(p, 2) for p in stats.predicted_tps],
            "reason": stats.reason,
            # What the policy knew at its latest choice (engine/stats.py ControllerReport):
            # calibrated verify ms per width, each drafter's cost per token relative to the
            # target, the predicted speedup of each gamma and the gamma it chose.
            "verify_ms": report.verify_ms if report else [],
            "draft_cost": report.draft_cost if report else {},
            "predicted_speedup": report.predicted_speedup if report else [],
            "gamma_chosen": report.gamma if report else None,
        },
    }
