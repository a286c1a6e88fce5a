"""What happens when a chat no longer fits the context: the overflow policies, as plain
functions over the messages and a token counter (shared by the page and the API).

- `drop-oldest` (the page's default, as Ollama does): leave out the oldest turns, keep the
  system prompt and the newest turn;
- `truncate-middle` (LM Studio's): keep the system prompt and the first turn, leave out the
  turns after it, oldest first;
- `stop`: refuse with a message that says what to do (the API's default, llama-server's).

A turn is a user message with the answers after it. The chat's messages stay as they are on
the page and on disk: a policy only chooses what the model reads. The prompt must leave room
for the answer: `reserve(max_tokens, n_ctx)` positions, at most half the context (an answer
that needs more ends at the context, "length").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from engine.errors import PromptTooLongError

DROP_OLDEST = "drop-oldest"
TRUNCATE_MIDDLE = "truncate-middle"
STOP = "stop"
POLICIES = (DROP_OLDEST, STOP, TRUNCATE_MIDDLE)
LABELS = {DROP_OLDEST: "drop the oldest turns (keep the system prompt)",
          STOP: "stop with a message", TRUNCATE_MIDDLE: "truncate the middle (keep the first turn)"}

Messages = Sequence[dict]


@dataclass(frozen=True)
class Fitted:
    """The messages the model reads, their tokens, and what was left out (in chat order)."""
    messages: tuple[dict, ...]
    tokens: list[int]
    dropped: tuple[dict, ...] = ()

    def note(self, policy: str) -> str:
        """One line on what was left out; empty when nothing was."""
        if not self.dropped:
            return ""
        users = sum(m["role"] == "user" for m in self.dropped)
        where = "oldest" if policy == DROP_OLDEST else "middle"
        return (f"left out the {where} {users} turn{'s' * (users != 1)} ({len(self.dropped)} "
                f"messages) to fit the context; the system prompt is kept")


def reserve(max_tokens: int, n_ctx: int) -> int:
    """Positions kept free for the answer."""
    return max(1, min(max_tokens, n_ctx // 2))


def split_turns(messages: Messages) -> tuple[list[dict], list[list[dict]]]:
    """(the leading system messages, the turns): a turn opens at each user message; anything
    before the first one belongs to the first turn."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    turns: list[list[dict]] = []
    for m in messages[head:]:
        if m["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(dict(m))
    return [dict(m) for m in messages[:head]], turns


def candidates(messages: Messages, policy: str) -> list[tuple[list[dict], list[dict]]]:
    """(kept, dropped) choices, from leaving nothing out to leaving out the most the policy
    allows; each leaves out more than the one before."""
    if policy not in POLICIES:
        raise ValueError(f"context overflow must be one of {', '.join(POLICIES)}, got {policy!r}")
    system, turns = split_turns(messages)
    whole = [(system + [m for t in turns for m in t], [])]
    if policy == STOP or len(turns) < 2:
        return whole
    out = whole
    if policy == DROP_OLDEST:
        for k in range(1, len(turns)):
            out.append((system + _join(turns[k:]), _join(turns[:k])))
        return out
    for k in range(1, len(turns) - 1):
        out.append((system + turns[0] + _join(turns[1 + k:]), _join(turns[1:1 + k])))
    # Last: the newest turn alone, the first one too left out.
    out.append((system + turns[-1], _join(turns[:-1])))
    return out


def _join(turns: list[list[dict]]) -> list[dict]:
    return [m for t in turns for m in t]


def fit(messages: Messages, policy: str, tokens_of: Callable[[list[dict]], list[int]],
        budget: int) -> Fitted:
    """The first of the policy's choices whose prompt takes at most `budget` tokens (searched
    by halves: each choice is shorter than the one before), else PromptTooLongError."""
    options = candidates(messages, policy)
    counted: dict[int, list[int]] = {}

    def fits(i: int) -> bool:
        counted[i] = counted.get(i) or tokens_of(options[i][0])
        return len(counted[i]) <= budget

    if fits(0):
        return Fitted(tuple(options[0][0]), counted[0])
    if policy == STOP or not fits(len(options) - 1):
        raise PromptTooLongError(_refusal(policy, len(counted[len(options) - 1]), budget))
    low, high = 0, len(options) - 1  # low does not fit, high does
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    kept, dropped = options[high]
    return Fitted(tuple(kept), counted[high], tuple(dropped))


def _refusal(policy: str, needed: int, budget: int) -> str:
    if policy == STOP:
        return (f"the chat needs {needed} tokens and the context has room for {budget} besides "
                "the answer; start a new chat, choose another overflow policy, or raise --ctx")
    return (f"even the newest message alone needs {needed} tokens and the context has room for "
            f"{budget} besides the answer; shorten it, lower max tokens, or raise --ctx")
