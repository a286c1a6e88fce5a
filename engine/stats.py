"""Statistics of a generation, returned as data: per round and for the whole run.

Time phases: `prefill_ms` evaluates the prompt on both models; the decode phase runs from the
end of prefill to the last committed token; `tokens_per_s` is output tokens over the decode
phase; `total_time_ms` is end-to-end (prefill included); `ttft_ms` is the time from the start
until the first output token was committed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.round_plan import PREDICTION


@dataclass
class RoundStats:
    index: int
    gamma: int
    # Tokens drafted and put before the target.
    drafted: int
    accepted: int
    kind: str
    committed: int
    draft_ms: float
    verify_ms: float
    # Who drafted the round, by name (reports), and whether its plan was a copy (from the
    # context or the history) rather than a model's draft (engine/round_plan.py).
    source: str = ""
    is_copy: bool = False
    # What the gamma policy expected of this round (None when it makes no prediction), and why
    # it chose this gamma, in one line.
    predicted_tps: float | None = None
    reason: str = ""
    # The target's top probability at each row up to the committed token (the accepted drafts'
    # positions, then the correction or bonus row); only for policies that ask for it
    # (`wants_confidence`).
    confidence: tuple[float, ...] = ()
    # The target batch's width as decoded: drafted + 1, or more when padded (engine/widths.py).
    width: int = 0
    # Tokens a grammar forced before the draft (committed without a model, decoded in the
    # batch as context).
    forced: int = 0
    # The last token the round committed (the target's own: a plain round's, a correction or a
    # bonus); None where not known. A plain round's judges a copy it did not draft
    # (engine/control/controller.py's `_watch`).
    token: int | None = None

    @property
    def measured_tps(self) -> float:
        ms = self.draft_ms + self.verify_ms
        return 1e3 * self.committed / ms if ms > 0 else 0.0


@dataclass
class ControllerReport:
    """What the gamma policy knew when it made its latest choice: the calibrated verify cost
    per batch width (ms, index w-1), each drafter's cost per token relative to one target token,
    the predicted speedup over plain decoding of each gamma 0..max (for the drafter of that
    round), the gamma chosen and why. Policies that predict nothing give the last two only."""
    policy: str
    gamma: int
    reason: str
    source: str = ""
    verify_ms: list[float] = field(default_factory=list)
    draft_cost: dict[str, float] = field(default_factory=dict)
    predicted_speedup: list[float] = field(default_factory=list)


@dataclass
class GenerationStats:
    mode: str = "speculative"
    drafter: str = ""
    gamma: int = 0
    prompt_tokens: int = 0
    # Of the prompt's tokens, those the target's KV cache already held from the previous
    # generation (a chat's earlier turns: engine/session.py `sync`), and those decoded now.
    prompt_cached_tokens: int = 0
    prompt_computed_tokens: int = 0
    output_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejected_rounds: int = 0
    # Output tokens a grammar forced: committed without a model (engine/grammar/guide.py).
    forced_tokens: int = 0
    rounds: int = 0
    target_calls: int = 0
    draft_time_ms: float = 0.0
    verify_time_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    total_time_ms: float = 0.0
    decode_time_ms: float = 0.0
    finish_reason: str = ""
    # Counts per draft position i (0-based): how often a token was drafted / accepted there.
    # Drafted and accepted tokens per drafting part (RoundStats.source: the draft model, prompt
    # lookup, the history of past requests...).
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    # Tokens drafted from the generation's prediction (engine/drafters/prediction.py) that the
    # target accepted, and those it rejected (OpenAI's accepted_prediction_tokens and
    # rejected_prediction_tokens).
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # Output-token index at which each accepted draft token landed (acceptance along the text).
    origins: list[str] = field(default_factory=list)
    gammas: list[int] = field(default_factory=list)
    # Per round: the policy's predicted tokens/s (None if it made none) and the measured one.
    predicted_tps: list[float | None] = field(default_factory=list)
    measured_tps: list[float] = field(default_factory=list)
    # The gamma policy's reason for the latest round's gamma, and its report on that choice.
    reason: str = ""
    controller: ControllerReport | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / (self.decode_time_ms / 1e3) if self.decode_time_ms > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def accepted_per_target_call(self) -> float:
        return self.accepted_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.output_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def target_calls_per_token(self) -> float:
        return self.target_calls / self.output_tokens if self.output_tokens else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def record_round(self, r: RoundStats, drafted_positions: int) -> None:
        self.rounds += 1
        # A round of forced tokens that ends the answer calls no model.
        self.target_calls += r.width > 0
        self.drafted_tokens += r.drafted
        self.accepted_tokens += r.accepted
        self.draft_time_ms += r.draft_ms
        self.verify_time_ms += r.verify_ms
        self.gammas.append(r.gamma)
        self.predicted_tps.append(r.predicted_tps)
        self.measured_tps.append(r.measured_tps)
        self.reason = r.reason or self.reason
        if r.drafted:
            self.drafted_by[r.source] = self.drafted_by.get(r.source, 0) + r.drafted
            self.accepted_by[r.source] = self.accepted_by.get(r.source, 0) + r.accepted
            if r.source == PREDICTION:
                self.accepted_prediction_tokens += r.accepted
                self.rejected_prediction_tokens += r.drafted - r.accepted
        if r.drafted and r.accepted < r.drafted:
            self.rejected_rounds += 1
        while len(self.drafted_at) < drafted_positions:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(r.drafted):
            self.drafted_at[i] += 1
            if i < r.accepted:
                self.accepted_at[i] += 1

    def as_dict(self) -> dict:
        # The fields, and the figures derived from them.
        return asdict(self) | {
            "tokens_per_s": self.tokens_per_s, "acceptance_rate": self.acceptance_rate,
            "accepted_per_target_call": self.accepted_per_target_call,
            "tokens_per_target_call": self.tokens_per_target_call,
            "target_calls_per_token": self.target_calls_per_token,
            "acceptance_by_position": self.acceptance_by_position}
