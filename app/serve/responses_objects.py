"""The engine's results as OpenAI Responses API objects (/v1/responses): a whole `response`
(its `output` items: a `reasoning` item with its `reasoning_text` where the model thought
(app/runtime/reasoning.py), a `message` with `output_text`, and one `function_call` per tool
call), and the stream's typed events (`response.created`, `response.output_item.added`,
`response.reasoning_text.delta`, `response.output_text.delta`,
`response.function_call_arguments.delta`, ...,
`response.completed`), each `event: TYPE` with its JSON and a `sequence_number`.

Tool calls are read as for chat (app/runtime/tool_reading.py); the statistics are the chat
answers' `speculative` object (app/serve/responses.py). A finished response is handed to the
request's stored responses (app/serve/responses_kept.py), which keep it unless `store` is false.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Sequence

from app.runtime.reasoning import Reasoning, ThoughtReader, split
from app.runtime.tool_reading import Arguments, Call, CallReader, Content, Piece, read_answer
from app.serve.parsing import GenerationRequest
from app.serve.responses import answer_reader, finish_reason, speculative
from app.serve.responses_kept import KeptResponses
from engine.logprobs import TokenLogprob
from engine.stats import GenerationStats


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def event(kind: str, n: int, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n, **fields})}\n\n"


class ResponsesFormatter:
    """The Responses objects of one request; the stream's items are built as it goes."""

    def __init__(self, request: GenerationRequest, body: dict, model: str,
                 kept: KeptResponses | None = None) -> None:
        self.request = request
        self.body = body
        self.model = model
        self.kept = kept
        self.id = _id("resp_")
        self.created = int(time.time())
        self.items: list[dict] = []
        self.open: dict | None = None  # the item being streamed
        self.n = 0
        self.calls_sent = 0

    @property
    def reads_calls(self) -> bool:
        return self.request.tools is not None and self.request.tools.offered

    def reader(self) -> CallReader | ThoughtReader | None:
        return answer_reader(self.request)

    def _response(self, status: str, stats: GenerationStats | None, thought: int = 0) -> dict:
        spec = self.request.spec
        tools = self.body.get("tools") or []
        out = {"id": self.id, "object": "response", "created_at": self.created,
               "status": status, "model": self.model, "output": list(self.items),
               "error": None, "incomplete_details": None,
               "instructions": self.body.get("instructions"),
               "max_output_tokens": self.body.get("max_output_tokens"),
               "metadata": self.body.get("metadata") or {},
               "parallel_tool_calls": self.request.tools.parallel if self.request.tools else True,
               "temperature": spec.sampling.temperature, "top_p": spec.sampling.top_p,
               "tool_choice": self.body.get("tool_choice") or "auto", "tools": tools,
               "text": self.body.get("text") or {"format": {"type": "text"}},
               "store": self.kept is not None and self.body.get("store", True) is not False,
               "previous_response_id": self.body.get("previous_response_id")}
        if stats is not None:
            if finish_reason(stats) == "length":
                out["status"] = "incomplete"
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            out["usage"] = {"input_tokens": stats.prompt_tokens,
                            # The prompt's tokens the slot's KV cache held (the conversation's
                            # earlier turns, when it still held them).
                            "input_tokens_details": {"cached_tokens": stats.prompt_cached_tokens},
                            "output_tokens": stats.output_tokens,
                            "output_tokens_details": {
                                "reasoning_tokens": thought,
                                "accepted_prediction_tokens": stats.accepted_prediction_tokens,
                                "rejected_prediction_tokens": stats.rejected_prediction_tokens},
                            "total_tokens": stats.prompt_tokens + stats.output_tokens}
            out["speculative"] = speculative(stats, self.request)
        return out

    def response(self, text: str, stats: GenerationStats,
                 logprobs: Sequence[TokenLogprob] = (), thought: int = 0) -> dict:
        reasoning, text = split(text, self.request.thinking)
        content: str | None = text
        calls = []
        if self.reads_calls and self.request.tools and self.request.syntax:
            content, calls = read_answer(text, self.request.syntax, self.request.tools)
        if reasoning is not None:
            self.items.append(self._reasoning(reasoning, "completed"))
        if content:
            self.items.append(self._message(content, "completed"))
        for call in calls:
            self.items.append(self._call(call.id, call.name, call.arguments, "completed"))
        return self._kept(self._response("completed", stats, thought))

    def _kept(self, response: dict) -> dict:
        if self.kept is not None:
            self.kept.keep(self.body, response)
        return response

    @staticmethod
    def _message(text: str, status: str) -> dict:
        return {"type": "message", "id": _id("msg_"), "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    @staticmethod
    def _reasoning(text: str, status: str) -> dict:
        """The thinking as OpenAI's reasoning item: its text as `reasoning_text` content (no
        summary is made)."""
        return {"type": "reasoning", "id": _id("rs_"), "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    @staticmethod
    def _call(call_id: str, name: str, arguments: str, status: str) -> dict:
        return {"type": "function_call", "id": _id("fc_"), "call_id": call_id, "name": name,
                "arguments": arguments, "status": status}

    def _event(self, kind: str, **fields) -> str:
        self.n += 1
        return event(kind, self.n - 1, **fields)

    def opening(self) -> str:
        head = self._response("in_progress", None)
        return (self._event("response.created", response=head)
                + self._event("response.in_progress", response=head))

    def piece(self, piece: Piece | Reasoning, logprobs: Sequence[TokenLogprob] = ()) -> str:
        if isinstance(piece, (Reasoning, Content)):
            # Text of the thinking's item, or of the message's (each opened by its first text).
            thought = isinstance(piece, Reasoning)
            kind, delta = (("reasoning", "response.reasoning_text.delta") if thought
                           else ("message", "response.output_text.delta"))
            out = "" if self.open and self.open["type"] == kind else self._start(
                (self._reasoning if thought else self._message)("", "in_progress"))
            self.open["content"][0]["text"] += piece.text  # type: ignore[index]
            return out + self._event(delta, item_id=self.open["id"],  # type: ignore[index]
                                     output_index=len(self.items), content_index=0,
                                     delta=piece.text)
        if isinstance(piece, Call):
            self.calls_sent += 1
            return self._start(self._call(piece.id, piece.name, "", "in_progress"))
        assert isinstance(piece, Arguments) and self.open is not None
        self.open["arguments"] += piece.text
        return self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                           output_index=len(self.items), delta=piece.text)

    def _start(self, item: dict) -> str:
        """Close the item being streamed, and open `item`."""
        out = self._finish_item()
        self.open = item
        out += self._event("response.output_item.added", output_index=len(self.items),
                           item=item)
        if item["type"] in ("message", "reasoning"):
            out += self._event("response.content_part.added", item_id=item["id"],
                               output_index=len(self.items), content_index=0,
                               part=dict(item["content"][0]))
        return out

    def _finish_item(self) -> str:
        item, self.open = self.open, None
        if item is None:
            return ""
        item["status"] = "completed"
        at = len(self.items)
        self.items.append(item)
        if item["type"] in ("message", "reasoning"):
            part = item["content"][0]
            done = ("response.output_text.done" if item["type"] == "message"
                    else "response.reasoning_text.done")
            out = (self._event(done, item_id=item["id"], output_index=at,
                               content_index=0, text=part["text"])
                   + self._event("response.content_part.done", item_id=item["id"],
                                 output_index=at, content_index=0, part=part))
        else:
            out = self._event("response.function_call_arguments.done", item_id=item["id"],
                              output_index=at, arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=at, item=item)

    def closing(self, stats: GenerationStats, logprobs: Sequence[TokenLogprob] = (),
                thought: int = 0) -> str:
        out = self._finish_item()
        final = self._kept(self._response("completed", stats, thought))
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=final)

    def failure(self, body: dict) -> str:
        error = body["error"]
        return self._event("error", code=error.get("code"), message=error["message"],
                           param=error.get("param"))
