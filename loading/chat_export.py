"""A saved chat as a file a person keeps elsewhere: Markdown to read, JSON to load again
(the store's own format, loading/chats.py)."""
from __future__ import annotations

import json
import re
import time

from loading.chats import Chat

SPEAKERS = {"user": "You", "assistant": "Assistant", "system": "System prompt"}


def to_markdown(chat: Chat) -> str:
    """The chat as Markdown: a title, the system prompt, then each message under its speaker."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(chat.updated))
    parts = [f"# {chat.title}", f"*Saved by Tandem, {when}*"]
    if chat.system:
        parts.append(f"## {SPEAKERS['system']}\n\n{chat.system}")
    parts += [f"## {SPEAKERS.get(m['role'], m['role'])}\n\n{m['content']}" for m in chat.messages]
    return "\n\n".join(parts) + "\n"


def to_json(chat: Chat) -> str:
    return json.dumps(chat.as_json(), ensure_ascii=False, indent=2) + "\n"


def file_stem(chat: Chat) -> str:
    """A file name for the chat's exports: its title, made safe, and its id."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", chat.title).strip("-").lower()[:40]
    return f"{words or 'chat'}-{chat.id}"
