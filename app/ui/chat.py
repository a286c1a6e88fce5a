"""The chat tab: a streaming multi-turn chat over `pair.generate` with a system prompt, retry,
edit, undo and stop, its saved chats in a sidebar (app/ui/chat_sidebar.py), a context meter and
an overflow policy (app/runtime/overflow.py), the live metrics panel and the token view.

Retry, edit and undo are Gradio's own Chatbot events (`.retry`, `.edit`, `.undo`, shown as
buttons on the messages), as are the copy buttons; each sends the chat up to the changed turn,
so the target's KV cache (engine/session.py `sync`) still holds everything before it.

Two tabs on one chat cannot lose each other's turns: every save names the chat's revision the
page last saw, and the store refuses one that is behind (loading/chats.py). A send from a page
behind the saved chat is refused before anything runs ("changed elsewhere": Reload shows the
new turns, and the page keeps what was typed); so is a second answer in a chat while one runs.
An answer whose chat changed elsewhere while it ran is kept as a new chat, and a warning says so.

The callback only forwards engine events to the page. It refreshes the page once per target
call (a RoundEvent) and at most every `MIN_REFRESH_S`, since re-rendering after every token would
take CPU from the decoding it is showing.
"""
from __future__ import annotations

import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

import gradio as gr

from app.runtime.tuned import chosen_acceptance, stale_line
from app.runtime.reasoning import after_thinking, thinking_for
from app.ui import chat_sidebar, controls, metrics, thoughts
from app.runtime.defaults import HISTORY, OVERFLOW, SYSTEM_PRESETS
from app.runtime.holder import READY, PairHolder
from app.runtime.overflow import LABELS as OVERFLOW_LABELS
from app.runtime.overflow import Fitted, fit, reserve
from app.runtime.request import RunSpec
from app.runtime.structured import OFF
from app.runtime.run import generate
from app.ui.state import StopFlags
from engine.errors import TandemError
from engine.events import DoneEvent, RoundEvent, TokenEvent
from engine.staleness import StaleDraftEvent, watch
from engine.stats import GenerationStats
from loading.chats import Chat, ChatChanged, ChatStore
from loading.history import History

MIN_REFRESH_S = 0.15
# What the chat streams to the page: history, token view, metrics panel, stats, the textbox,
# the context meter.
Frame = tuple[list[dict], str, str, "dict | None", str, str]
CHANGED = ("Changed elsewhere: this chat has new turns from another tab or window since this page "
           "showed it, so nothing here was run or saved. Press Reload to see them, then try "
           "again.")
ANSWERING = ("This chat is answering already (in this tab or another): wait for that answer to "
             "end, press Reload, then send again.")


def refusal(message: str) -> gr.Error:
    """The error a refused send shows, until the person closes it."""
    return gr.Error(message, duration=None, title="Not sent", print_exception=False)


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
            for m in history if m.get("role") in ("user", "assistant", "system")
            and not thoughts.is_thought(m)]


def stats_payload(stats: GenerationStats, text: str) -> dict:
    return {"text": text, **stats.as_dict()}


def chat_messages(system: str, history: list[dict], message: str) -> list[dict]:
    """What the model reads: the system prompt (when there is one), the chat, the new message."""
    head = [{"role": "system", "content": system}] if system and system.strip() else []
    return head + to_messages(history) + [{"role": "user", "content": message}]


def pop_last_turn(history: list[dict]) -> tuple[list[dict], str]:
    """The chat without its last user message and the answers after it, and that message's
    text (retry sends it again; undo puts it back in the box)."""
    i = len(history) - 1
    while i >= 0 and history[i].get("role") != "user":
        i -= 1
    if i < 0:
        return list(history), ""
    return list(history[:i]), plain_text(history[i].get("content"))


def respond(holder: PairHolder, flags: StopFlags, session: str, message: str, history: list[dict],
            spec: RunSpec, system: str = "", overflow: str = OVERFLOW) -> Iterator[Frame]:
    """Yield (history, token view, metrics panel, stats, textbox, context meter) while the answer
    streams, once this answer's turn in the holder's queue (shared with the API) has come. Only
    the first frame empties the textbox: what is typed there while the answer runs is kept. The
    chat is fitted to the context by `overflow` (app/runtime/overflow.py). With `spec.history`
    the answer drafts from the history of past requests and is added to it."""
    if not message or not message.strip():
        raise gr.Error("type a message first")
    try:
        ticket = holder.queue.join()
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    try:
        holder.queue.wait(ticket)
        yield from _answer(holder, flags, session, message, history, spec,
                           holder.history_for() if spec.history else None, system, overflow)
    finally:
        holder.queue.leave(ticket)


def _start(holder: PairHolder, message: str, history: list[dict], spec: RunSpec,
           past: History | None, system: str,
           overflow: str) -> tuple[Iterator, Fitted, thoughts.Shown]:
    """The generation's events, the messages it reads, fitted to the context, and how its
    answer shows."""
    try:
        spec, shown = _thinking(holder, spec)
        if spec.grammar is not None:
            # Refused (with llguidance's message) before the message leaves the box.
            holder.pair.compile_grammar(spec.grammar)
        pair = holder.pair
        fitted = fit(chat_messages(system, history, message), overflow, pair.tokens_for,
                     pair.n_ctx - reserve(spec.max_tokens, pair.n_ctx))
        events = watch(generate(pair, replace(spec, prompt=fitted.messages), fitted.tokens,
                                history=past.index if past else None),
                       chosen_acceptance(holder.pairing, spec.drafter))
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    return events, fitted, shown


def _thinking(holder: PairHolder, spec: RunSpec) -> tuple[RunSpec, thoughts.Shown]:
    """For a model that thinks (app/runtime/reasoning.py): its grammar after the thinking, and
    its thought shown folded (app/ui/thoughts.py)."""
    backend = holder.pair.target.backend
    thinking = thinking_for(backend, holder.reasoning_format)
    return (replace(spec, grammar=after_thinking(spec.grammar, thinking, backend)),
            thoughts.Shown(thinking, backend.token_bytes))


def _answer(holder: PairHolder, flags: StopFlags, session: str, message: str, history: list[dict],
            spec: RunSpec, past: History | None, system: str, overflow: str) -> Iterator[Frame]:
    events, fitted, shown = _start(holder, message, history, spec, past, system, overflow)
    n_ctx, note = holder.pair.n_ctx, fitted.note(overflow)

    def meter(out: int) -> str:
        return metrics.context_meter(len(fitted.tokens) + out, n_ctx, note)

    at = len(history) + 1  # where the answer's messages begin
    history = [*history, {"role": "user", "content": message}, {"role": "assistant", "content": ""}]
    pieces: list[metrics.Piece] = []
    answer = ""
    stats: GenerationStats | None = None
    flags.begin(session)
    yield history, metrics.token_view(pieces), metrics.live_panel(None), None, "", meter(0)
    last = time.monotonic()
    try:
        for ev in events:
            if isinstance(ev, TokenEvent):
                answer += ev.text
                pieces.append(metrics.Piece(ev.text, ev.origin))
                shown.tokens.append(ev.token)
            elif isinstance(ev, RoundEvent):
                stats = ev.stats
                if flags.stopped(session):
                    break
                if time.monotonic() - last >= MIN_REFRESH_S:
                    last = time.monotonic()
                    history[at:] = shown.messages(answer)
                    yield (history, metrics.token_view(pieces), metrics.live_panel(stats), None,
                           gr.update(), meter(len(pieces)))
            elif isinstance(ev, StaleDraftEvent):
                gr.Warning(stale_line(ev))
            elif isinstance(ev, DoneEvent):
                if past is not None:
                    past.save()
                history[at:] = shown.messages(ev.text, done=True)
                yield (history, metrics.token_view(pieces), metrics.live_panel(ev.stats, done=True),
                       stats_payload(ev.stats, ev.text), gr.update(), meter(ev.stats.output_tokens))
                return
    except TandemError as exc:
        raise gr.Error(str(exc)) from None
    finally:
        events.close()
        flags.end(session)
    # Stopped by the user: the generator is closed, so the lock is free for the next request.
    history[at:] = shown.messages(answer, done=True)
    if stats is not None:
        stats.finish_reason = "stopped"
        stats.output_tokens = len(pieces)
    yield (history, metrics.token_view(pieces), metrics.live_panel(stats, done=False, note="stopped"),
           stats_payload(stats, answer) if stats else None, gr.update(), meter(len(pieces)))


def _settings(drafters: list[str], default_drafter: str) -> tuple[list, gr.Checkbox, gr.Button, list,
                                                                  gr.Dropdown, gr.Textbox]:
    """The settings accordion: the shared controls, the history's switch and its clear button,
    structured output, the overflow policy and the predicted output."""
    with gr.Accordion("settings", open=False, elem_id="chat-settings"):
        widgets = controls.build(drafters, default_drafter, "chat")
        with gr.Row():
            remember = gr.Checkbox(
                value=HISTORY, label="learn from past requests", elem_id="chat-history",
                info="hybrid and suffix copy from your earlier prompts and answers, "
                     "kept on this machine only (off: neither read nor added to)")
            forget = gr.Button("clear history", size="sm", elem_id="chat-forget")
        overflow = gr.Dropdown([(label, name) for name, label in OVERFLOW_LABELS.items()],
                               value=OVERFLOW, label="when the chat outgrows the context",
                               elem_id="chat-overflow")
        output = controls.build_output("chat")
        prediction = controls.build_prediction("chat")
    return widgets, remember, forget, output, overflow, prediction


@dataclass
class Values:
    """The values every chat event reads, in `ChatTab.inputs` order."""
    history: list[dict]
    settings: list[Any]  # controls.WIDGETS' values
    remember: bool
    output: str
    schema: str
    chat_id: str
    system: str
    overflow: str
    # The predicted output box (empty: none).
    prediction: str = ""
    # The chat's revision the page last saw (loading/chats.py; 0: none saved yet).
    revision: int = 0

    @classmethod
    def of(cls, values: tuple) -> "Values":
        n = len(controls.WIDGETS)
        history, *rest = values
        settings, (remember, output, schema, chat_id, system, overflow, *tail) = (
            rest[:n], rest[n:])
        prediction, revision = (tail[0] if tail else ""), (tail[1] if len(tail) > 1 else 0)
        return cls(list(history or []), list(settings), bool(remember), output, schema,
                   chat_id or "", system or "", overflow or OVERFLOW, prediction or "",
                   int(revision or 0))

    def spec(self, holder: PairHolder) -> RunSpec:
        try:
            return controls.spec(holder.offer(), *self.settings, self.remember,
                                 output=self.output, schema=self.schema,
                                 prediction=self.prediction)
        except TandemError as exc:
            raise gr.Error(str(exc)) from None

    def kept(self) -> dict[str, Any]:
        """What the chat keeps of its controls."""
        return {**dict(zip(controls.WIDGETS, self.settings)), "overflow": self.overflow,
                "history": self.remember, "output": self.output, "schema": self.schema,
                "prediction": self.prediction}


class ChatTab:
    """The chat tab's components and its events: send, retry, edit, undo, stop, and the
    sidebar's chats (app/ui/chat_sidebar.py), saved in `store` as they go."""

    def __init__(self, holder: PairHolder, flags: StopFlags, store: ChatStore) -> None:
        self.holder, self.flags, self.store = holder, flags, store
        # The chats an answer runs in now, in any tab of this server.
        self._answers: set[str] = set()
        self._answers_lock = threading.Lock()

    def layout(self, drafters: list[str], default_drafter: str) -> None:
        with gr.Row():
            with gr.Column(scale=1, min_width=200, elem_id="chat-sidebar"):
                self.side = chat_sidebar.build()
            with gr.Column(scale=3):
                self.state, self.revision = gr.State(""), gr.State(0)
                with gr.Row(equal_height=True):
                    self.preset = gr.Dropdown(list(SYSTEM_PRESETS), value=None, label="preset",
                                              scale=1, elem_id="chat-preset")
                    self.system = gr.Textbox(label="system prompt", lines=1, max_lines=6, scale=4,
                                             placeholder="how the assistant should answer (kept "
                                             "with this chat)", elem_id="chat-system")
                # Where an opened chat ran on another pair than the loaded one (one line).
                self.notice = gr.HTML("", elem_id="chat-notice")
                self.meter = gr.HTML(metrics.context_meter(None, None), elem_id="chat-context")
                self.chatbot = gr.Chatbot(label="chat", height=380, elem_id="chatbot",
                                          editable="user", buttons=["copy", "copy_all"])
                with gr.Row(equal_height=True):
                    self.message = gr.Textbox(placeholder="Ask for some code…", show_label=False,
                                              scale=8, elem_id="chat-input", lines=1,
                                              container=False)
                    self.send_button = gr.Button("Send", variant="primary", scale=1, min_width=80,
                                                 elem_id="chat-send")
                self.stop = gr.Button("Stop", variant="stop", size="sm", elem_id="chat-stop")
                (self.widgets, self.remember, self.forget, self.output,
                 self.overflow, self.prediction) = _settings(drafters, default_drafter)
            with gr.Column(scale=2):
                self.panel = gr.HTML(metrics.live_panel(None), elem_id="chat-metrics")
                self.tokens = gr.HTML(metrics.token_view([]), elem_id="chat-tokens")
                with gr.Accordion("raw statistics", open=False):
                    self.stats = gr.JSON(label="stats", elem_id="chat-stats")

    @property
    def inputs(self) -> list:
        return [self.chatbot, *self.widgets, self.remember, *self.output, self.state,
                self.system, self.overflow, self.prediction, self.revision]

    @property
    def outputs(self) -> list:
        """What an answer updates: respond's frame, then the chat's id, the list and the
        chat's revision."""
        return [self.chatbot, self.tokens, self.panel, self.stats, self.message, self.meter,
                self.state, self.side.chats, self.revision]

    @property
    def kept_controls(self) -> list:
        """The controls of chat_sidebar.RESTORED, in its order."""
        return [*self.widgets, self.overflow, self.remember, *self.output, self.prediction]

    def run(self, request: gr.Request, message: str, v: Values) -> Iterator[tuple]:
        """Answer `message` after `v.history`, saving the chat as it goes: once the answer
        starts (the question is kept), and when it ends, is stopped or fails. Refused (the
        module's docstring) where the page is behind the saved chat or the chat is answering."""
        chat, frame, started, failed = self._chat(v), None, False, None
        with self._answering(chat.id):
            with closing(respond(self.holder, self.flags, request.session_hash or "", message,
                                 v.history, v.spec(self.holder), v.system, v.overflow)) as frames:
                try:
                    for frame in frames:
                        if not started:
                            # The answer starts: the question is kept from now on.
                            chat, started = self._save_turn(chat, frame[0], v), True
                            yield (*frame, chat.id, chat_sidebar.listing(self.store, chat.id),
                                   chat.revision)
                        else:
                            yield (*frame, chat.id, gr.update(), chat.revision)
                except gr.Error as exc:
                    failed = exc
                finally:
                    if started:
                        chat = self._keep(chat, frame[0], v)
        if started:
            # Failed too: the page takes the revision its last save made, then the error.
            yield (*frame, chat.id, chat_sidebar.listing(self.store, chat.id), chat.revision)
        if failed is not None:
            raise failed

    @contextmanager
    def _answering(self, chat_id: str) -> Iterator[None]:
        """One answer at a time in a chat: another is refused while it runs."""
        with self._answers_lock:
            if chat_id in self._answers:
                raise refusal(ANSWERING)
            self._answers.add(chat_id)
        try:
            yield
        finally:
            with self._answers_lock:
                self._answers.discard(chat_id)

    def _chat(self, v: Values) -> Chat:
        """The chat an answer goes into: the page's, or a new one. A send from an empty chat
        window never overwrites a saved conversation (one the page had not shown yet); one from
        a page behind the saved chat is refused."""
        chat = self.store.get(v.chat_id) if v.chat_id else None
        if chat is None or (chat.messages and not v.history):
            return self.store.new(v.system, chat_sidebar.chat_settings(v.kept()))
        if chat.revision != v.revision:
            raise refusal(CHANGED)
        return chat

    def _save(self, chat: Chat, history: list[dict], v: Values) -> Chat:
        messages = [m for m in to_messages(history) if m["content"] or m["role"] == "user"]
        saved = self.store.save(chat_sidebar.with_messages(chat, messages, v.system, v.kept(),
                                                           chat_sidebar.ran_on(self.holder)))
        if saved.id != v.chat_id:
            self.store.remember(saved.id)
        return saved

    def _save_turn(self, chat: Chat, history: list[dict], v: Values) -> Chat:
        """`_save`, refused (nothing sent, nothing saved) where the chat changed elsewhere."""
        try:
            return self._save(chat, history, v)
        except ChatChanged:
            raise refusal(CHANGED) from None

    def _keep(self, chat: Chat, history: list[dict], v: Values) -> Chat:
        """An answer's chat saved as it ends. Where the chat changed elsewhere while it ran
        (another server on the store, a delete), this page's conversation is kept whole as a
        new chat instead, and a warning names it."""
        try:
            return self._save(chat, history, v)
        except ChatChanged:
            copy = replace(self.store.new(v.system), title=f"{chat.title} (copy)", named=True)
            saved = self._save(copy, history, v)
            gr.Warning(f"Changed elsewhere: this chat changed in another tab or window while "
                       f"this answer ran, so this page's conversation is saved as a new chat, "
                       f"“{saved.title}”: no turn is lost.", duration=None)
            return saved

    def send(self, request: gr.Request, message: str, history: list[dict], drafter: str,
             policy: str, gamma: float, temperature: float, top_k: float, top_p: float,
             min_p: float, seed: float | None, max_tokens: float, remember: bool = HISTORY,
             output: str | None = None, schema: str | None = None, chat_id: str | None = None,
             system: str | None = None, overflow: str | None = None,
             prediction: str | None = None, revision: int | None = None) -> Iterator[tuple]:
        """The page's (and the /chat API's) send; the settings by name, as the API lists them."""
        yield from self.run(request, message, Values.of((
            history, drafter, policy, gamma, temperature, top_k, top_p, min_p, seed, max_tokens,
            remember, output or OFF, schema or "", chat_id, system, overflow, prediction,
            revision)))

    def retry(self, request: gr.Request, *values: Any) -> Iterator[tuple]:
        """The last answer again: the chat up to the last question, which is sent again (the
        KV cache still holds everything before the answer, so it starts at once)."""
        v = Values.of(values)
        v.history, message = pop_last_turn(v.history)
        yield from self.run(request, message, v)

    def edit(self, edit: gr.EditData, request: gr.Request, *values: Any) -> Iterator[tuple]:
        """A sent message changed: the chat up to it, then the new text, answered afresh."""
        v = Values.of(values)
        index = edit.index[0] if isinstance(edit.index, (list, tuple)) else edit.index
        v.history = v.history[:index]
        yield from self.run(request, plain_text(edit.value), v)

    def undo(self, *values: Any) -> tuple:
        """The last question and its answer leave the chat; the question goes back in the box."""
        v = Values.of(values)
        history, message = pop_last_turn(v.history)
        chat, revision = self.store.get(v.chat_id) if v.chat_id else None, v.revision
        if chat is not None:
            with self._answering(chat.id):
                # Refused where the page is behind the saved chat.
                revision = self._save_turn(replace(chat, revision=v.revision), history, v).revision
        return history, message, self.count(v.system, history), revision

    def count(self, system: str, history: list[dict], note: str = "") -> str:
        """The context meter for a chat at rest (a dash until a model is loaded)."""
        if self.holder.status.state != READY:
            return metrics.context_meter(None, None)
        pair = self.holder.pair
        messages = to_messages(history)
        head = [{"role": "system", "content": system}] if system.strip() else []
        used = len(pair.tokens_for(head + messages)) if messages else 0
        return metrics.context_meter(used, pair.n_ctx, note)

    def show(self, chat: Chat | None) -> tuple:
        """The page's values for an opened chat (None: a new, empty one)."""
        if chat is not None:
            self.store.remember(chat.id)
        messages = list(chat.messages) if chat else []
        system = chat.system if chat else ""
        drafters = chat_sidebar.offered(self.holder)
        return (chat.id if chat else "", messages, system, chat.title if chat else "",
                chat_sidebar.listing(self.store, chat.id if chat else None),
                self.count(system, messages), metrics.live_panel(None), metrics.token_view([]),
                *chat_sidebar.restored(chat, chat_sidebar.RESTORED, drafters),
                chat.revision if chat else 0, self.differences(chat, drafters))

    @property
    def shown(self) -> list:
        return [self.state, self.chatbot, self.system, self.side.title, self.side.chats,
                self.meter, self.panel, self.tokens, *self.kept_controls, self.revision,
                self.notice]

    def differences(self, chat: Chat | None, drafters: tuple[str, ...] | None) -> str:
        return chat_sidebar.differences(chat, chat_sidebar.ran_on(self.holder), drafters)

    def reapply(self, chat_id: str) -> tuple:
        """After a load set drafter, policy and gamma from the pairing record (app/ui): the
        open chat's own again, and its line about the pair."""
        chat = self.store.get(chat_id) if chat_id else None
        drafters = chat_sidebar.offered(self.holder)
        return (*chat_sidebar.restored(chat, chat_sidebar.CHOICES, drafters),
                self.differences(chat, drafters))

    def open(self, chat_id: str | None) -> tuple:
        chat = self.store.get(chat_id) if chat_id else None
        if chat_id and chat is None:
            gr.Warning("that chat is gone (deleted in another tab?)")
        return self.show(chat)

    def rename(self, chat_id: str, title: str) -> tuple:
        if not chat_id:
            raise gr.Error("send a message first: an empty chat is not saved")
        try:
            chat = self.store.rename(chat_id, title)
        except TandemError as exc:
            raise gr.Error(str(exc)) from None
        return chat.title, chat_sidebar.listing(self.store, chat.id)

    def delete(self, chat_id: str) -> tuple:
        if chat_id:
            self.store.delete(chat_id)
        rest = self.store.list()
        return self.show(rest[0] if rest else None)

    def save_system(self, chat_id: str, system: str) -> None:
        chat = self.store.get(chat_id) if chat_id else None
        if chat is not None and chat.system != system:
            self.store.set_system(chat.id, system)

    def wire(self) -> None:
        """The events."""
        common = dict(concurrency_limit=None, show_progress="hidden")
        # Not limited by Gradio: answers take their turns in the holder's queue (app/runtime/queue.py).
        self.send_button.click(self.send, [self.message, *self.inputs], self.outputs,
                               api_name="chat", **common)
        self.message.submit(self.send, [self.message, *self.inputs], self.outputs,
                            api_visibility="private", **common)
        self.chatbot.retry(self.retry, self.inputs, self.outputs, api_visibility="private", **common)
        self.chatbot.edit(self.edit, self.inputs, self.outputs, api_visibility="private", **common)
        self.chatbot.undo(self.undo, self.inputs,
                          [self.chatbot, self.message, self.meter, self.revision],
                          api_visibility="private", queue=False)
        self.stop.click(self.stop_answer, None, None, api_name="stop", queue=False)
        self.forget.click(self.forget_history, None, None, api_visibility="private", queue=False)
        self.wire_sidebar()

    def wire_sidebar(self) -> None:
        side, private = self.side, dict(api_visibility="private", queue=False)
        side.new.click(lambda: self.show(None), None, self.shown, **private)
        # The Chatbot's own clear button starts a new chat too (the cleared one stays saved).
        self.chatbot.clear(lambda: self.show(None), None, self.shown, **private)
        side.chats.input(self.open, side.chats, self.shown, **private)
        # The chat as saved now (another tab's turns too); what was typed stays in the box.
        side.reload.click(self.open, self.state, self.shown, **private)
        side.rename.click(self.rename, [self.state, side.title], [side.title, side.chats], **private)
        side.title.submit(self.rename, [self.state, side.title], [side.title, side.chats], **private)
        side.delete.click(self.delete, self.state, self.shown, **private)
        side.export_md.click(lambda i: chat_sidebar.export(self.store, i, "md"), self.state,
                             side.download, **private)
        side.export_json.click(lambda i: chat_sidebar.export(self.store, i, "json"), self.state,
                               side.download, **private)
        self.preset.input(chat_sidebar.preset_text, self.preset, self.system, **private)
        self.system.blur(self.save_system, [self.state, self.system], None, **private)

    def stop_answer(self, request: gr.Request) -> None:
        self.flags.stop(request.session_hash or "")

    def forget_history(self) -> None:
        store = self.holder.history
        if store is None:
            raise gr.Error("history is off (--no-history) or no model is loaded")
        store.clear()
        gr.Info("history cleared")

    def open_last(self) -> tuple:
        """What a page (re)load shows: the chat open last (after a restart too)."""
        return self.show(self.store.last())


def build(holder: PairHolder, flags: StopFlags, drafters: list[str], default_drafter: str,
          store: ChatStore | None = None) -> dict[str, Any]:
    """Lay out the chat tab inside the current Blocks; returns the components others update,
    and `open_last` with the components it fills, for the page's load event."""
    tab = ChatTab(holder, flags, store or ChatStore())
    tab.layout(drafters, default_drafter)
    tab.wire()
    return {**dict(zip(controls.WIDGETS, tab.widgets)), "chatbot": tab.chatbot,
            "open_last": tab.open_last, "shown": tab.shown, "reapply": tab.reapply,
            "chat_id": tab.state, "reapplied": [*tab.widgets[:3], tab.notice]}
