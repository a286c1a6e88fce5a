"""A reasoning model's thinking in the chat (app/runtime/reasoning.py): shown folded above its
answer as Gradio's own thought message (a Chatbot message whose `metadata` has a title: open
while it streams, "pending", then "done"), titled with its own token count. The thought is
the page's only: the chat keeps and sends back the answers alone (`is_thought`), as the
templates of the models that think leave earlier turns' thinking out."""
from __future__ import annotations

from typing import Callable

from app.runtime.reasoning import Thinking, split, thought_tokens


def is_thought(message: dict) -> bool:
    """Whether a chat message is a thought (not a turn of the conversation)."""
    return bool((message.get("metadata") or {}).get("title"))


class Shown:
    """One answer as the chat shows it, from its text and its tokens so far."""

    def __init__(self, thinking: Thinking | None, token_bytes: Callable[[int], bytes]) -> None:
        self.thinking = thinking
        self.token_bytes = token_bytes
        self.tokens: list[int] = []

    def messages(self, text: str, done: bool = False) -> list[dict]:
        """The answer's messages: its thought, when it thinks, then the answer."""
        reasoning, content = split(text, self.thinking)
        answer = {"role": "assistant", "content": content}
        if reasoning is None:
            return [answer]
        n = thought_tokens(self.thinking, text, self.tokens, self.token_bytes)
        thinking = not done and not content
        thought = {"role": "assistant", "content": reasoning, "metadata": {
            "title": f"{'thinking' if thinking else 'thought'} · {n} token{'s' * (n != 1)}",
            "status": "pending" if thinking else "done"}}
        return [thought, answer] if content or done else [thought]
