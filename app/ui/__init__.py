"""The Gradio app: a loading/status banner over three tabs (chat with its saved conversations,
side-by-side, models).

`build_app(holder)` builds the Blocks without launching; `page_mounter` hands app/serve/server.py
`launch(...)` what puts it on its app, behind the same guard as the API.
Every generation takes its turn in the holder's queue (app/runtime/queue.py, shared with the
API), so a second user waits there instead of competing for the cores; Gradio does not limit
those events itself.
"""
from __future__ import annotations

import html
import os
import time
from typing import Callable, Iterator

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from app.ui import chat, compare, wizard  # noqa: E402
from app.runtime.defaults import DEFAULT_DRAFTER, DEFAULT_GAMMA, DEFAULT_POLICY, PLAIN  # noqa: E402
from app.runtime.holder import ERROR, LOADING, READY, PairHolder  # noqa: E402
from app.ui.state import StopFlags  # noqa: E402
from loading.chats import ChatStore  # noqa: E402

TITLE = "Tandem: exact speculative decoding"
POLL_S = 0.4


def status_banner(holder: PairHolder) -> str:
    s = holder.status
    if s.state == LOADING:
        pct = 100 * s.fraction
        return (f'<div id="tandem-status" data-state="loading" style="padding:8px 12px;border-radius:8px;'
                f'border:1px solid #3b7dd8">Loading models, step {s.step + 1} of {len(s.steps)}: '
                f'{html.escape(s.message)} ({s.elapsed_s:.0f} s)'
                f'<div style="margin-top:6px;height:8px;border-radius:4px;background:rgba(128,128,128,.25)">'
                f'<div style="width:{pct:.0f}%;height:8px;border-radius:4px;background:#3b7dd8"></div></div></div>')
    if s.state == ERROR:
        return (f'<div id="tandem-status" data-state="error" style="padding:8px 12px;border-radius:8px;'
                f'border:1px solid #d9534f;background:#d9534f1a"><b>The models could not be loaded.</b> '
                f'{html.escape(s.message)}<br><span style="font-size:.85em">Pick another pair in the '
                f'Models tab, or restart with <code>tandem ui --target PATH --draft PATH</code>.</span></div>')
    if s.state == READY:
        extra = f" · the last load failed: {html.escape(s.error)}" if s.error else ""
        if holder.offload is not None:
            extra += f'<br><span id="tandem-offload">{html.escape(holder.offload.line())}</span>'
        return (f'<div id="tandem-status" data-state="ready" style="font-size:.85em;opacity:.85">'
                f'target <b>{html.escape(s.target)}</b> · draft <b>{html.escape(s.draft)}</b> · '
                f'{html.escape(s.message)}{extra}</div>')
    return ('<div id="tandem-status" data-state="empty">No model is loaded: pick a pair in the '
            'Models tab.</div>')


def _choice_updates(holder: PairHolder) -> tuple[dict, ...]:
    """The chat's and the side-by-side tab's drafter, policy and gamma as the loaded pair and its
    pairing record choose them (app/runtime/tuned.py), so a user who changes nothing runs what
    the CLI and the API run."""
    if holder.status.state != READY:
        return (gr.update(),) * 6
    offer = holder.offer()
    speculative = [d for d in offer.drafters if d != PLAIN]
    policy = offer.tuned.get("policy", DEFAULT_POLICY)
    gamma = offer.tuned.get("gamma", DEFAULT_GAMMA[policy])
    settled = (gr.update(value=policy), gr.update(value=gamma))
    return (gr.update(choices=list(offer.drafters), value=offer.drafter), *settled,
            gr.update(choices=speculative, value=offer.drafter if offer.drafter in speculative
                      else (speculative[0] if speculative else None)), *settled)


def build_app(holder: PairHolder, flags: StopFlags | None = None,
              chats: ChatStore | None = None, start: wizard.Start | None = None) -> gr.Blocks:
    """The whole page for `holder`'s pair; it works (and says so) while loading or after a
    failure. `chats`: where the chat tab saves its conversations (default: the user's store);
    `start`: what the Models tab's fields start from (`tandem ui`'s flags)."""
    flags = flags or StopFlags()
    ready = holder.status.state == READY
    drafters = list(holder.offer().drafters) if ready else [DEFAULT_DRAFTER, "draft", PLAIN]
    default = holder.offer().drafter if ready else DEFAULT_DRAFTER
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"## {TITLE}\nA small draft model proposes tokens; the target checks them in one "
                    "batch and keeps exactly its own distribution.")
        banner = gr.HTML(status_banner(holder), elem_id="status-banner")
        with gr.Tabs():
            with gr.Tab("Chat", id="chat"):
                chat_parts = chat.build(holder, flags, drafters, default, chats)
            with gr.Tab("Side by side", id="compare"):
                compare_parts = compare.build(holder, flags, drafters, default)
            with gr.Tab("Models", id="models"):
                wizard_parts = wizard.build(holder, start)
        choices = [parts[name] for parts in (chat_parts, compare_parts)
                   for name in ("drafter", "policy", "gamma")]

        def watch() -> Iterator[tuple]:
            while holder.status.state == LOADING:
                yield (status_banner(holder), *(gr.update(),) * len(choices))
                time.sleep(POLL_S)
            yield (status_banner(holder), *_choice_updates(holder))

        # A reload, or the first page after a restart, opens the chat open last. Once a load
        # has set the choices from the pairing record, the open chat takes its own drafter,
        # policy and gamma back (and says where it ran on another pair): in this order.
        reapply = (chat_parts["reapply"], chat_parts["chat_id"], chat_parts["reapplied"])
        private = {"api_visibility": "private", "queue": False}
        demo.load(chat_parts["open_last"], None, chat_parts["shown"], **private).then(
            watch, None, [banner, *choices], api_name="status", concurrency_limit=None,
            show_progress="hidden").then(*reapply, **private)
        wizard_parts["load_event"].then(lambda: (status_banner(holder), *_choice_updates(holder)),
                                        None, [banner, *choices], **private).then(*reapply,
                                                                                 **private)
    return demo


def page_mounter(demo: gr.Blocks) -> Callable[[FastAPI, str, int], None]:
    """What app/serve/server.py's `launch` calls to put `demo` at "/" of its app."""
    return lambda app, host, port: mount_page(app, demo, host, port)


def mount_page(app: FastAPI, demo: gr.Blocks, host: str, port: int) -> None:
    """Queue the page and mount it at "/" of `app` (after any routes of its own, which the mount
    would otherwise take)."""
    demo.queue(default_concurrency_limit=1)
    gr.mount_gradio_app(app, demo, path="/", server_name=host, server_port=port,
                        footer_links=["api"], show_error=True, ssr_mode=False)
