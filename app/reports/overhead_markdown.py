"""The overhead tables of `tandem bench --overhead`: the engine's own time per token on each path
and sampling mode, and the constraint's own cost, as Markdown (bench/overhead/ measures them)."""
from __future__ import annotations

from typing import Sequence

from bench.fakes.spelled import Spelling
from bench.overhead.engine_time import OverheadRow
from bench.overhead.grammar import GrammarOverheadRow
from bench.overhead.history import HistoryTiming


def markdown(rows: Sequence[OverheadRow], n_vocab: int, machine: str,
             history: HistoryTiming | None = None) -> str:
    lines = [f"Engine time per committed token (ms), instant backends at {n_vocab:,} tokens; "
             f"{machine}", "",
             "| path | sampling | ms / token | ms / round | tokens / round | acceptance |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        acc = "—" if r.acceptance != r.acceptance else f"{r.acceptance:.2f}"
        lines.append(f"| {r.path} | {r.mode} | {r.ms_per_token:.3f} | {r.ms_per_round:.3f} | "
                     f"{r.tokens_per_round:.2f} | {acc} |")
    if history is not None:
        lines += ["", f"History lookup ({history.tokens:,} tokens, {history.lookups} lookups of "
                  f"Zipf text, {history.found:.0%} matched): median {history.median_ms:.3f} ms, "
                  f"p90 {history.p90_ms:.3f} ms a round; adding a 512-token answer "
                  f"{history.add_ms:.1f} ms."]
    return "\n".join(lines)


def grammar_markdown(rows: Sequence[GrammarOverheadRow], spelling: Spelling, machine: str) -> str:
    lines = [f"The constraint's own cost: engine time per committed token (ms), free and under a "
             f"JSON schema, instant backends spelling with {spelling.name} "
             f"({spelling.n_vocab:,} tokens); {machine}", "",
             "| path | sampling | free ms / token | JSON schema ms / token | of which llguidance "
             "| forced | tokens / round | tokens an answer |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.path} | {r.mode} | {r.free_ms_per_token:.3f} | {r.ms_per_token:.3f} | "
                     f"{r.llguidance_ms_per_token:.3f} | {r.forced_share:.0%} | "
                     f"{r.tokens_per_round:.2f} | {r.answer_tokens:.0f} |")
    return "\n".join(lines)
