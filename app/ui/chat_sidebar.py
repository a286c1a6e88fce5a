"""The chat tab's sidebar: the saved chats (loading/chats.py) newest first, and new, open,
reload, rename, delete and export (Markdown and JSON) over them; what an opened chat gives back
to the controls, and the line that says where it ran on another pair than the loaded one.

Gradio has no list-of-conversations component (`gr.ChatInterface(save_history=True)` keeps
chats in the browser's local storage, per browser, not on disk, and it has no rename or
export), so the list is a `gr.Radio` whose choices are the chats' titles, and the store is
Tandem's own. `gr.Sidebar` is a page-wide drawer; the list belongs to the chat tab alone, so
it sits in a column there.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import html

import gradio as gr

from app.runtime.defaults import SYSTEM_PRESETS
from app.runtime.holder import READY, PairHolder
from app.runtime.loader_settings import option
from app.ui.controls import WIDGETS
from loading.chat_export import file_stem, to_json, to_markdown
from loading.chats import Chat, ChatStore

# The settings a chat keeps and an opened chat gives back to its controls, by the controls'
# names: app/ui/controls.py WIDGETS (drafter, policy, gamma, sampling, max tokens), the
# overflow policy, the history switch, the constraint (structured output and its schema) and
# the predicted output. Its system prompt is the chat's own field. A page's load sets drafter,
# policy and gamma from the pairing record first, then gives an open chat's back (app/ui).
RESTORED = (*WIDGETS, "overflow", "history", "output", "schema", "prediction")
# The drafter, policy and gamma alone: what a load of a pair sets and an open chat takes back.
CHOICES = WIDGETS[:3]


@dataclass
class Sidebar:
    new: gr.Button
    chats: gr.Radio
    title: gr.Textbox
    reload: gr.Button
    rename: gr.Button
    delete: gr.Button
    export_md: gr.Button
    export_json: gr.Button
    download: gr.File


def build() -> Sidebar:
    """The sidebar's components, in the current column."""
    new = gr.Button("+ New chat", variant="secondary", size="sm", elem_id="chat-new")
    chats = gr.Radio(choices=[], value=None, label="chats", elem_id="chat-list",
                     info="newest first; saved on this machine as you go")
    title = gr.Textbox(label="name", placeholder="this chat's name", elem_id="chat-title",
                       max_lines=1)
    with gr.Row():
        reload = gr.Button("Reload", size="sm", elem_id="chat-reload")
        rename = gr.Button("Rename", size="sm", elem_id="chat-rename")
        delete = gr.Button("Delete", size="sm", variant="stop", elem_id="chat-delete")
    with gr.Row():
        export_md = gr.Button("Export .md", size="sm", elem_id="chat-export-md")
        export_json = gr.Button("Export .json", size="sm", elem_id="chat-export-json")
    download = gr.File(label="export", elem_id="chat-export", interactive=False, visible=False)
    return Sidebar(new, chats, title, reload, rename, delete, export_md, export_json, download)


def listing(store: ChatStore, current: str | None) -> dict:
    """The list's update: every chat by title, newest first, the current one chosen."""
    choices = [(c.title, c.id) for c in store.list()]
    ids = {i for _, i in choices}
    return gr.update(choices=choices, value=current if current in ids else None)


def export(store: ChatStore, chat_id: str, kind: str) -> dict:
    """The chat written to a temporary file, shown for the browser to download."""
    chat = store.get(chat_id) if chat_id else None
    if chat is None:
        raise gr.Error("nothing to export yet: send a message first")
    text = to_markdown(chat) if kind == "md" else to_json(chat)
    out = Path(tempfile.mkdtemp(prefix="tandem-export-")) / f"{file_stem(chat)}.{kind}"
    out.write_text(text, encoding="utf-8")
    return gr.update(value=str(out), visible=True)


def preset_text(name: str | None) -> str:
    return SYSTEM_PRESETS.get(name or "", "")


def chat_settings(values: dict[str, Any]) -> dict[str, Any]:
    """What a chat keeps of its controls' values (numbers as JSON has them)."""
    return {k: v for k, v in values.items() if v is None or isinstance(v, (int, float, str, bool))}


def offered(holder: PairHolder) -> tuple[str, ...] | None:
    """The loaded pair's drafters (None while none is loaded)."""
    return holder.offer().drafters if holder.status.state == READY else None


def restored(chat: Chat | None, names: tuple[str, ...],
             drafters: tuple[str, ...] | None = None) -> list:
    """The controls' updates for `names` from an opened chat (unchanged where it kept none, and
    the drafter unchanged where the loaded pair's `drafters` do not offer it)."""
    kept = chat.settings if chat is not None else {}

    def usable(name: str) -> bool:
        return (name in kept and name in RESTORED and
                (name != "drafter" or drafters is None or kept[name] in drafters))
    return [gr.update(value=kept[n]) if usable(n) else gr.update() for n in names]


def ran_on(holder: PairHolder) -> dict[str, Any]:
    """What a turn runs on: the loaded pair's target and draft, and the loader's settings it
    was asked for by their names (app/runtime/loader_settings.py; the context alone for a pair
    handed in whole); empty while none is loaded."""
    s = holder.status
    if s.state != READY:
        return {}
    settings = (holder.settings.as_dict() if holder.settings is not None
                else {"ctx": holder.pair.n_ctx})
    return {"target": s.target, "draft": s.draft, **settings}


def differences(chat: Chat | None, now: dict[str, Any], drafters: tuple[str, ...] | None) -> str:
    """The one line an opened chat shows where it ran on another pair or loader settings than
    the loaded ones, or with a drafter the loaded pair does not offer ("" where none differ)."""
    if chat is None or not now:
        return ""
    parts = [f"{name if name in ('target', 'draft') else option(name)} {was} (now {now.get(name)})"
             for name, was in chat.pair.items() if now.get(name) != was]
    drafter = chat.settings.get("drafter")
    if drafters is not None and drafter is not None and drafter not in drafters:
        parts.append(f"drafter {drafter} (this pair does not offer it)")
    if not parts:
        return ""
    return ('<div id="chat-differs" style="font-size:.85em;padding:4px 8px;border-left:3px '
            f'solid #d9a400">This chat ran with {html.escape(", ".join(parts))}: load that pair '
            'in the Models tab to run it as it ran.</div>')


def with_messages(chat: Chat, messages: list[dict], system: str, settings: dict[str, Any],
                  pair: dict[str, Any]) -> Chat:
    return replace(chat, messages=tuple(messages), system=system, settings=chat_settings(settings),
                   pair=pair or chat.pair)
