"""The chat tab: a streaming multi-turn chat over `pair.generate`, with stop and clear, the live
metrics panel and the token view.

The callback only forwards engine events to the page. It refreshes the page once per target
call (a RoundEvent) and at most every `MIN_REFRESH_S`, since re-rendering after every token would
take CPU from the decoding it is showing.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterator

import gradio as gr

from app.runtime.tuned import chosen_acceptance, stale_line
from app.ui import controls, metrics
from app.runtime.defaults import HISTORY
from app.runtime.holder import PairHolder
from app.runtime.request import RunSpec
from app.runtime.run import generate
from app.ui.state import StopFlags
from engine.errors import TandemError
from engine.events import DoneEvent, RoundEvent, TokenEvent
from engine.staleness import StaleDraftEvent, watch
from engine.stats import GenerationStats
from loading.history import History

MIN_REFRESH_S = 0.15


def plain_text(content: Any) -> str:
    """Message content as a string: the Chatbot hands back lists of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("content") or "")
    if isinstance(content, (list, tuple)):
        return "".join(plain_text(c) for c in content)
    return "" if content is None else str(content)


def to_messages(history: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": plain_text(m.get("content"))}
            for m in history if m.get("role") in ("user", "assistant", "system")]


def stats_payload(stats: GenerationStats, text: str) -> dict:
    return {"text": text, **stats.as_dict()}


def respond(holder: PairHolder, flags: StopFlags, session: str, message: str, history: list[dict],
            spec: RunSpec) -> Iterator[tuple[list[dict], str, str, dict | None, str]]:
    """Yield (history, token view, metrics panel, stats, textbox) while the answer streams,
    once this answer's turn in the holder's queue (shared with the API) has come. With
    `spec.history` the answer drafts from the history of past requests and is added to it."""
    if not message or not message.strip():
        raise gr.Error("type a message first")
    try:
        ticket = holder.queue.join()
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    try:
        holder.queue.wait(ticket)
        yield from _answer(holder, flags, session, message, history, spec,
                           holder.history_for() if spec.history else None)
    finally:
        holder.queue.leave(ticket)


def _answer(holder: PairHolder, flags: StopFlags, session: str, message: str, history: list[dict],
            spec: RunSpec, past: History | None
            ) -> Iterator[tuple[list[dict], str, str, dict | None, str]]:
    try:
        if spec.grammar is not None:
            # Refused (with llguidance's message) before the message leaves the box.
            holder.pair.compile_grammar(spec.grammar)
        messages = to_messages(history) + [{"role": "user", "content": message}]
        events = watch(generate(holder.pair, replace(spec, prompt=tuple(messages)),
                                history=past.index if past else None),
                       chosen_acceptance(holder.pairing, spec.drafter))
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    history = [*history, {"role": "user", "content": message}, {"role": "assistant", "content": ""}]
    pieces: list[metrics.Piece] = []
    answer = ""
    stats: GenerationStats | None = None
    flags.begin(session)
    yield history, metrics.token_view(pieces), metrics.live_panel(None), None, ""
    last = time.monotonic()
    try:
        for ev in events:
            if isinstance(ev, TokenEvent):
                answer += ev.text
                pieces.append(metrics.Piece(ev.text, ev.origin))
            elif isinstance(ev, RoundEvent):
                stats = ev.stats
                if flags.stopped(session):
                    break
                if time.monotonic() - last >= MIN_REFRESH_S:
                    last = time.monotonic()
                    history[-1] = {"role": "assistant", "content": answer}
                    yield history, metrics.token_view(pieces), metrics.live_panel(stats), None, ""
            elif isinstance(ev, StaleDraftEvent):
                gr.Warning(stale_line(ev))
            elif isinstance(ev, DoneEvent):
                if past is not None:
                    past.save()
                history[-1] = {"role": "assistant", "content": ev.text}
                yield (history, metrics.token_view(pieces), metrics.live_panel(ev.stats, done=True),
                       stats_payload(ev.stats, ev.text), "")
                return
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    finally:
        events.close()
        flags.end(session)
    # Stopped by the user: the generator is closed, so the lock is free for the next request.
    history[-1] = {"role": "assistant", "content": answer}
    if stats is not None:
        stats.finish_reason = "stopped"
        stats.output_tokens = len(pieces)
    yield (history, metrics.token_view(pieces), metrics.live_panel(stats, done=False, note="stopped"),
           stats_payload(stats, answer) if stats else None, "")


def _settings(drafters: list[str], default_drafter: str) -> tuple[list, gr.Checkbox, gr.Button, list]:
    """The settings accordion: the shared controls, the history's switch and its clear button,
    and structured output."""
    with gr.Accordion("settings", open=False, elem_id="chat-settings"):
        widgets = controls.build(drafters, default_drafter, "chat")
        with gr.Row():
            remember = gr.Checkbox(
                value=HISTORY, label="learn from past requests", elem_id="chat-history",
                info="hybrid and suffix copy from your earlier prompts and answers, "
                     "kept on this machine only (off: neither read nor added to)")
            forget = gr.Button("clear history", size="sm", elem_id="chat-forget")
        output = controls.build_output("chat")
    return widgets, remember, forget, output


def build(holder: PairHolder, flags: StopFlags, drafters: list[str], default_drafter: str) -> dict[str, Any]:
    """Lay out the chat tab inside the current Blocks; returns the components others update."""
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="chat", height=380, elem_id="chatbot")
            with gr.Row(equal_height=True):
                message = gr.Textbox(placeholder="Ask for some code…", show_label=False, scale=8,
                                     elem_id="chat-input", lines=1, container=False)
                send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="chat-send")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", size="sm", elem_id="chat-stop")
                clear = gr.Button("Clear", size="sm", elem_id="chat-clear")
            widgets, remember, forget, output = _settings(drafters, default_drafter)
        with gr.Column(scale=2):
            panel = gr.HTML(metrics.live_panel(None), elem_id="chat-metrics")
            tokens = gr.HTML(metrics.token_view([]), elem_id="chat-tokens")
            with gr.Accordion("raw statistics", open=False):
                stats = gr.JSON(label="stats", elem_id="chat-stats")

    def on_send(message_text: str, history: list[dict], drafter: str, policy: str, gamma: float,
                temperature: float, top_k: float, top_p: float, min_p: float, seed: float | None,
                max_tokens: float, remember_value: bool, output_choice: str, schema: str,
                request: gr.Request):
        try:
            spec = controls.spec(holder.offer(), drafter, policy, gamma, temperature, top_k,
                                 top_p, min_p, seed, max_tokens, bool(remember_value),
                                 output=output_choice, schema=schema)
        except TandemError as exc:
            raise gr.Error(str(exc)) from None
        yield from respond(holder, flags, request.session_hash or "", message_text, history or [],
                           spec)

    def on_stop(request: gr.Request) -> None:
        flags.stop(request.session_hash or "")

    def on_forget() -> None:
        store = holder.history
        if store is None:
            raise gr.Error("history is off (--no-history) or no model is loaded")
        store.clear()
        gr.Info("history cleared")

    inputs = [message, chatbot, *widgets, remember, *output]
    outputs = [chatbot, tokens, panel, stats, message]
    # Not limited by Gradio: answers take their turns in the holder's queue (app/runtime/queue.py).
    send.click(on_send, inputs, outputs, api_name="chat", concurrency_limit=None,
               show_progress="hidden")
    message.submit(on_send, inputs, outputs, api_visibility="private", concurrency_limit=None,
                   show_progress="hidden")
    stop.click(on_stop, None, None, api_name="stop", queue=False)
    forget.click(on_forget, None, None, api_visibility="private", queue=False)
    clear.click(lambda: ([], metrics.token_view([]), metrics.live_panel(None), None), None,
                [chatbot, tokens, panel, stats], api_name="clear", queue=False)
    return {**dict(zip(controls.WIDGETS, widgets)), "chatbot": chatbot}
