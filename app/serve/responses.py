"""The engine's results as OpenAI objects: whole responses, stream chunks, usage, and the
`speculative` object that carries the generation's statistics.

Everything here formats what the engine measured (engine/stats.py); nothing is estimated.
Tool calls are read from the answer's text by app/runtime/tool_calls.py; log probabilities are
the target's, per committed token (engine/logprobs.py), in OpenAI's chat shape
(`logprobs.content[]`) or the legacy completions' (`tokens`, `token_logprobs`, ...).
`controller` holds the gamma of every round, the plain rounds, the policy's predictions, its
one-line reason for the latest round's gamma and what it knew then (costs, predicted speedups).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Callable, Sequence

from app.runtime.reasoning import Reasoning, ThoughtReader, split
from app.runtime.tool_reading import Call, CallReader, Content, Piece, read_answer
from app.serve.parsing import GenerationRequest
from engine.logprobs import TokenLogprob
from engine.stats import GenerationStats

# The engine's finish reasons in OpenAI's words: an end-of-generation token or a stop string
# both end an answer normally.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
OBJECTS = {"chat": ("chat.completion", "chat.completion.chunk"),
           "completion": ("text_completion", "text_completion")}
ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}
# The lowest log probability written: JSON has no -Infinity (OpenAI writes -9999.0 too).
FLOOR_LOGPROB = -9999.0


def answer_reader(request: GenerationRequest) -> CallReader | ThoughtReader | None:
    """The reader of a streamed answer: its thinking apart, where the model thinks, and its
    tool calls, where it is read for them (arguments stream as drawn when every tool is held to
    its schema, `strict`); None when the text goes out as it is."""
    tools, syntax = request.tools, request.syntax
    calls = None
    if tools is not None and tools.offered and syntax is not None:
        calls = CallReader(syntax, tools, all(f.strict for f in tools.functions))
    return ThoughtReader(request.thinking, calls) if request.thinking is not None else calls


def model_id(file_name: str) -> str:
    """The id a model is served under: its file name without the .gguf suffix."""
    return file_name[:-5] if file_name.lower().endswith(".gguf") else file_name


class Formatter:
    """The OpenAI objects of one request: one id and creation time for all its chunks."""

    def __init__(self, request: GenerationRequest, model: str,
                 token_bytes: Callable[[int], bytes]) -> None:
        self.request = request
        self.kind = request.kind
        self.model = model
        # A token's bytes, for log probabilities (the target's vocabulary).
        self.token_bytes = token_bytes
        self.id = ID_PREFIX[self.kind] + uuid.uuid4().hex
        self.created = int(time.time())
        self.calls_sent = 0

    @property
    def reads_calls(self) -> bool:
        """Whether the answer is read for tool calls (tools offered, not tool_choice none)."""
        return self.request.tools is not None and self.request.tools.offered

    def reader(self) -> CallReader | ThoughtReader | None:
        return answer_reader(self.request)

    def _head(self, chunk: bool) -> dict:
        return {"id": self.id, "object": OBJECTS[self.kind][int(chunk)], "created": self.created,
                "model": self.model}

    def _choice(self, text: str | None, finish: str | None, chunk: bool, first: bool = False,
                logprobs: Sequence[TokenLogprob] = (), calls: Sequence[dict] = (),
                reasoning: str | None = None) -> dict:
        lp = self.logprobs(logprobs, text or "")
        if self.kind == "completion":
            # Tool calls on completions: beside the text, in the chat's shape (an extension).
            return {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish,
                    **({"tool_calls": list(calls)} if calls else {})}
        if chunk:
            delta: dict = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["tool_calls"] = list(calls)
            return {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        message: dict = {"role": "assistant", "content": text}
        if reasoning is not None:
            # llama-server's field (--reasoning-format deepseek), which DeepSeek's API sends too.
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = list(calls)
        return {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish}

    def response(self, text: str, stats: GenerationStats,
                 logprobs: Sequence[TokenLogprob] = (), thought: int = 0) -> dict:
        """The whole answer; `thought`: how many of its tokens are its thinking."""
        reasoning, text = split(text, self.request.thinking)
        content: str | None = text
        calls: list[dict] = []
        if self.reads_calls and self.request.tools and self.request.syntax:
            content, found = read_answer(text, self.request.syntax, self.request.tools)
            calls = [c.as_dict() for c in found]
            self.calls_sent = len(calls)
        return {**self._head(False),
                "choices": [self._choice(content, self.finish_reason(stats), chunk=False,
                                         logprobs=logprobs, calls=calls, reasoning=reasoning)],
                "usage": usage(stats, thought), "speculative": speculative(stats, self.request)}

    def opening(self) -> str:
        """A chat stream opens with the assistant's role, as OpenAI's does (completions: no
        opening)."""
        if self.kind != "chat":
            return ""
        return sse({**self._head(True), "choices": [self._choice("", None, True, first=True)]})

    def delta(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> str:
        return sse({**self._head(True), "choices": [self._choice(text, None, True,
                                                                 logprobs=logprobs)]})

    def piece(self, piece: Piece | Reasoning, logprobs: Sequence[TokenLogprob] = ()) -> str:
        """A piece of the answer as read for tool calls: text as a content delta, thinking as a
        `reasoning_content` delta (llama-server's); a call as
        OpenAI streams one: its index, id, type and name (arguments ""), then its arguments
        as they come."""
        if isinstance(piece, Content):
            return self.delta(piece.text, logprobs)
        if isinstance(piece, Reasoning):
            return sse({**self._head(True), "choices": [self._choice(
                None, None, True, logprobs=logprobs, reasoning=piece.text)]})
        if isinstance(piece, Call):
            self.calls_sent += 1
            delta = {"index": piece.index, "id": piece.id, "type": "function",
                     "function": {"name": piece.name, "arguments": ""}}
        else:
            delta = {"index": piece.index, "function": {"arguments": piece.text}}
        return sse({**self._head(True), "choices": [self._choice(None, None, True, calls=[delta],
                                                                 logprobs=logprobs)]})

    def finish_reason(self, stats: GenerationStats) -> str:
        """The engine's reason in OpenAI's words; an answer that ended normally with tool calls
        ends with "tool_calls"."""
        reason = finish_reason(stats)
        return "tool_calls" if self.calls_sent and reason == "stop" else reason

    def logprobs(self, logprobs: Sequence[TokenLogprob], text: str) -> dict | None:
        """The tokens' log probabilities in the endpoint's shape; None when not asked for."""
        if self.request.spec.logprobs is None:
            return None
        if self.kind == "chat":
            return {"content": [self._entry(lp) for lp in logprobs]}
        tokens = [self._text(lp.token) for lp in logprobs]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens,
                "token_logprobs": [max(lp.logprob, FLOOR_LOGPROB) for lp in logprobs],
                "top_logprobs": [{self._text(t): max(v, FLOOR_LOGPROB) for t, v in lp.top}
                                 for lp in logprobs],
                "text_offset": offsets}

    def _text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def _entry(self, lp: TokenLogprob) -> dict:
        def one(token: int, logprob: float) -> dict:
            piece = self.token_bytes(token)
            return {"token": piece.decode("utf-8", errors="replace"),
                    "logprob": max(logprob, FLOOR_LOGPROB), "bytes": list(piece)}
        return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}

    def failure(self, body: dict) -> str:
        """An error after the stream began: its body as an event, then [DONE]."""
        return sse(body) + DONE

    def closing(self, stats: GenerationStats, logprobs: Sequence[TokenLogprob] = (),
                thought: int = 0) -> str:
        """The finish reason (with the log probabilities no earlier chunk carried), then the
        statistics chunk (no choices, like OpenAI's usage chunk), then the [DONE] line."""
        finish = {**self._head(True), "choices": [self._choice(
            None, self.finish_reason(stats), True,
            logprobs=logprobs if self.request.spec.logprobs is not None else ())]}
        final: dict = {**self._head(True), "choices": []}
        if self.request.include_usage:
            final["usage"] = usage(stats, thought)
        final["speculative"] = speculative(stats, self.request)
        return sse(finish) + sse(final) + DONE


DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def finish_reason(stats: GenerationStats) -> str:
    return FINISH_REASONS.get(stats.finish_reason, stats.finish_reason or "stop")


def usage(stats: GenerationStats, thought: int = 0) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.output_tokens,
            "total_tokens": stats.prompt_tokens + stats.output_tokens,
            # OpenAI's name for the prompt tokens the KV cache already held.
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached_tokens},
            "completion_tokens_details": prediction_usage(stats, thought)}


def prediction_usage(stats: GenerationStats, thought: int = 0) -> dict:
    """OpenAI's completion_tokens_details: the answer's tokens of thinking (`thought`,
    app/runtime/reasoning.py), the prediction's tokens the target accepted, and those drafted
    from it that it rejected (0 and 0 without a prediction, and with plain decoding, which
    drafts nothing)."""
    return {"reasoning_tokens": thought, "audio_tokens": 0,
            "accepted_prediction_tokens": stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens}


def speculative(stats: GenerationStats, request: GenerationRequest) -> dict:
    """The draft statistics of one generation, as measured by the engine."""
    report = stats.controller
    return {
        "mode": stats.mode,
        "drafter": request.spec.drafter,
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        # Tokens a grammar forced (the only one it allowed): committed without any model.
        "forced_tokens": stats.forced_tokens,
        # Per drafting part: the draft model, prompt lookup ("prompt-lookup"), the caller's
        # history of past requests ("suffix").
        "by_source": {k: {"drafted": v, "accepted": stats.accepted_by.get(k, 0)}
                      for k, v in stats.drafted_by.items()},
        "target_calls": stats.target_calls,
        "rounds": stats.rounds,
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "decode_ms": round(stats.decode_time_ms, 1),
        "ttft_ms": round(stats.ttft_ms, 1),
        # The prompt's tokens the target's KV cache held from the previous request (a chat's
        # earlier turns) and those decoded for this one.
        "prompt_cached_tokens": stats.prompt_cached_tokens,
        "prompt_computed_tokens": stats.prompt_computed_tokens,
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
