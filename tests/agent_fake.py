"""A byte-level fake that answers as a small tool-using model does, for the client suite's
short form (tests/test_clients.py): its logits favour one scripted answer, read from the
conversation the chat template rendered (tests/byte_fake.py's ChatByteFake):

- after a tool's result: "The tool says: RESULT";
- with tools offered: a call of the first tool in Qwen2.5-Coder's fenced-JSON form (what the
  embedded target writes), its arguments from `ARGUMENTS` by the tool's name;
- a question that asks for JSON: `ANSWER_JSON`; else a sentence.

Where a grammar takes the answer off the script (the arguments of a schema it does not know),
the fake favours ending, then closing what is open, so its answers end. The logits are the
byte fake's noise plus the script's margin, so the draft (noise > 0) agrees with it mostly.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np

from tests.byte_fake import EOG, ChatByteFake

ARGUMENTS = {"get_weather": {"city": "Paris"}, "add": {"a": 17, "b": 25},
             "City": {"name": "Paris", "country": "France"},
             "final_result": {"name": "Paris", "country": "France"}}
ANSWER_JSON = '{"name":"Paris","country":"France"}'
SENTENCE = "Paris is the capital of France."
MARGIN = 40.0
ASSISTANT = b"[assistant]"


def scripted(prompt: str) -> str:
    """The answer the fake writes after `prompt` (ChatByteFake's rendering)."""
    turns = prompt.split("\n[")
    last = turns[-1] if turns else ""
    if last.startswith("tool]"):
        return "The tool says: " + last.removeprefix("tool]").strip()
    tools = re.findall(r'^\{"type": "function", "function": \{"name": "([^"]+)"', prompt, re.M)
    if tools:
        body = json.dumps({"name": tools[0], "arguments": ARGUMENTS.get(tools[0], {})},
                          indent=2)
        return f"```json\n{body}\n```"
    return ANSWER_JSON if "JSON" in last else SENTENCE


class AgentFake(ChatByteFake):
    def script(self, prompt: str) -> str:
        """The answer after `prompt`, from the assistant's turn marker on."""
        return scripted(prompt)

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        out = super().decode(tokens, pos, rows)
        for i, r in enumerate(rows):
            context = self.cache[:pos + r + 1]
            out[i] += self._favoured(context)
        return out

    def _favoured(self, context: list[int]) -> np.ndarray:
        text = b"".join(self.token_bytes(t) if t != EOG else b"" for t in context)
        at = text.rfind(ASSISTANT)
        boost = np.zeros(self.n_vocab, dtype=np.float32)
        if at < 0:
            return boost
        prompt = text[:at].decode("utf-8", "replace")
        script = self.tokenize(self.script(prompt) if at >= 0 else "") + [EOG]
        answer = context[len(self.tokenize(text[:at + len(ASSISTANT)].decode("utf-8",
                                                                         "replace"))):]
        if len(answer) < len(script) and answer == script[:len(answer)]:
            boost[script[len(answer)]] = MARGIN
        else:  # off the script: end, else close what is open
            boost[EOG] = MARGIN
            for closer, margin in ((b'"', 0.6), (b"}", 0.5), (b"]", 0.4)):
                boost[closer[0]] = MARGIN * margin
        return boost
