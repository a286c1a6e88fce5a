"""The answer being committed: its tokens and text, and the rules that end it (an
end-of-generation token, a stop string or the config's `until` rule, the token budget, the
context).

A round offers tokens (engine/round.py); `commit` takes them in order until one of the rules
ends the answer, turning each into text as it goes (engine/textstream.py). The answer also
keeps the generation's clock: its start, the end of the prefill, the first token.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from engine.backend import Backend
from engine.clock import Clock
from engine.events import FORCED, DoneEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.stats import GenerationStats
from engine.textstream import TextStream

if TYPE_CHECKING:
    from engine.round import RoundResult


class Answer:
    def __init__(self, backend: Backend, config: GenerationConfig, stats: GenerationStats,
                 clock: Clock) -> None:
        self.backend = backend
        self.config = config
        self.stats = stats
        self.clock = clock
        self.stream = TextStream(backend.token_bytes, config.stop)
        self.tokens: list[int] = []
        # Why the answer ended ("eos", "stop", "length"); empty while it goes on.
        self.finish = ""
        self.t_start = clock()
        self.t_prefill = self.t_start

    def prefilled(self) -> None:
        """The prompt is in the caches: decoding starts now."""
        self.t_prefill = self.clock()
        self.stats.prefill_ms = self.t_prefill - self.t_start

    def room(self, n_context: int) -> int:
        """The most tokens the next round may draft after a context of `n_context` tokens: the
        round commits one more, and both the answer and the context must hold them. Below 0
        no round fits: the answer ends at its length (`end_at_length`)."""
        return min(self.config.max_tokens - len(self.tokens) - 1,
                   self.backend.n_ctx - n_context - 1)

    def end_at_length(self) -> None:
        """End the answer: no round fits in the answer's or the context's length."""
        self.finish = "length"

    def commit(self, result: RoundResult, context: list[int]) -> Iterator[TokenEvent]:
        """Commit the round's tokens in order, appending each to `context`, until one ends
        the answer (an end-of-generation token is not committed)."""
        logprobs = result.logprobs or (None,) * len(result.tokens)
        for token, origin, logprob in zip(result.tokens, result.origins, logprobs):
            if self.backend.is_eog(token):
                self.finish = "eos"
                return
            context.append(token)
            self.tokens.append(token)
            self.stats.origins.append(origin)
            self.stats.forced_tokens += origin == FORCED
            result.stats.committed += 1
            text = self.stream.push(token)
            if not self.stats.ttft_ms:
                self.stats.ttft_ms = self.clock() - self.t_start
            yield TokenEvent(token=token, text=text, origin=origin, index=len(self.tokens) - 1,
                             logprob=logprob)
            if self.stream.stopped or (text and self.config.until is not None
                                       and self.config.until(text)):
                self.finish = "stop"
                return
            if len(self.tokens) >= self.config.max_tokens:
                self.finish = "length"
                return

    def flush(self) -> Iterator[TokenEvent]:
        """The text held back for an incomplete character or a possible stop string."""
        tail = self.stream.finish()
        if tail:
            yield TokenEvent(token=-1, text=tail, origin="flush", index=len(self.tokens) - 1)

    def done(self) -> DoneEvent:
        """The finished answer with the generation's statistics."""
        t_end = self.clock()
        s = self.stats
        s.output_tokens = len(self.tokens)
        s.total_time_ms = t_end - self.t_start
        s.decode_time_ms = t_end - self.t_prefill
        s.finish_reason = self.finish
        if not s.ttft_ms:
            s.ttft_ms = s.total_time_ms
        return DoneEvent(text=self.stream.text, stats=s, tokens=tuple(self.tokens))
