"""The chat tab's sidebar: the saved chats (loading/chats.py) newest first, and new, open,
rename, delete and export (Markdown and JSON) over them.

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

import gradio as gr

from app.runtime.defaults import SYSTEM_PRESETS
from loading.chat_export import file_stem, to_json, to_markdown
from loading.chats import Chat, ChatStore

# The settings a chat keeps and an opened chat gives back to its controls, by the controls'
# names (app/ui/controls.py WIDGETS, and the overflow policy). Drafter, policy and gamma follow
# the loaded pair and its pairing record (app/ui/__init__.py), so they are kept, not restored.
RESTORED = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "overflow")


@dataclass
class Sidebar:
    new: gr.Button
    chats: gr.Radio
    title: gr.Textbox
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
        rename = gr.Button("Rename", size="sm", elem_id="chat-rename")
        delete = gr.Button("Delete", size="sm", variant="stop", elem_id="chat-delete")
    with gr.Row():
        export_md = gr.Button("Export .md", size="sm", elem_id="chat-export-md")
        export_json = gr.Button("Export .json", size="sm", elem_id="chat-export-json")
    download = gr.File(label="export", elem_id="chat-export", interactive=False, visible=False)
    return Sidebar(new, chats, title, rename, delete, export_md, export_json, download)


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


def restored(chat: Chat | None, names: tuple[str, ...]) -> list:
    """The controls' updates for `names` from an opened chat (unchanged where it kept none)."""
    kept = chat.settings if chat is not None else {}
    return [gr.update(value=kept[n]) if n in kept and n in RESTORED else gr.update()
            for n in names]


def with_messages(chat: Chat, messages: list[dict], system: str,
                  settings: dict[str, Any]) -> Chat:
    return replace(chat, messages=tuple(messages), system=system, settings=chat_settings(settings))
