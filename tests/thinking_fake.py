"""A byte-level fake of a reasoning model (Qwen3, DeepSeek-R1): `<think>` and `</think>` are
control tokens written as their text (as llama.cpp writes Qwen3's), and its chat template
thinks as theirs do: it drops the thinking of earlier assistant turns, and with `opened` its
generation prompt opens the thinking (DeepSeek-R1's, QwQ's). It answers as tests/agent_fake.py's
AgentFake does, after thinking `THOUGHT`.
"""
from __future__ import annotations

import json
from typing import Sequence

from tests.agent_fake import AgentFake, scripted
from tests.byte_fake import TAGS

OPEN, CLOSE = "<think>", "</think>"
THOUGHT = "The user wants a short answer; I give it."


class ThinkingFake(AgentFake):
    TAGS = (*TAGS, OPEN, CLOSE)
    # Whether the generation prompt opens the thinking.
    opened = False

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        text = "".join(json.dumps(t) + "\n" for t in tools or ())
        for i, m in enumerate(messages):
            content = m.get("content") or ""
            if m["role"] == "assistant" and i < last_user and CLOSE in content:
                content = content.split(CLOSE)[-1].lstrip()
            text += f"[{m['role']}]{content}\n"
        return text + "[assistant]" + (OPEN + "\n" if self.opened else "")

    def script(self, prompt: str) -> str:
        return f"{OPEN}\n{THOUGHT}\n{CLOSE}\n\n{scripted(prompt)}"


class OpenedThinkingFake(ThinkingFake):
    opened = True


class TemplateBackend:
    """A chat template alone, rendered as llama.cpp's backend renders a model's
    (engine/llama/backend.py `render_chat`): what `template_thinking` reads."""

    def __init__(self, template: str, bos: str = "", eos: str = "") -> None:
        self.template, self.bos, self.eos = template, bos, eos

    def chat_prompt(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        from engine.llama.backend import render_chat
        return render_chat(self.template, messages, tools, bos=self.bos, eos=self.eos)


# Templates written as the thinking models' are: the earlier turns' thinking dropped (Qwen3's),
# and with the generation prompt opening it (DeepSeek-R1's later ones, QwQ's).
_TURNS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' and '</think>' in m.content %}"
          "{{ m.content.split('</think>')[-1] | trim }}{% else %}{{ m.content }}{% endif %}"
          "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
DROPS_THINKING = _TURNS
OPENS_THINKING = _TURNS + "<think>\n"
