"""The Markdown report of a benchmark run: context, speedup per category, gamma sweep, Amdahl
view, Leviathan prediction and acceptance by position, with links to the plots."""
from __future__ import annotations

import math
from typing import Sequence

from bench.benchmark.aggregate import Summary
from bench.benchmark.gpu_profile import PROFILE, available
from bench.benchmark.theory import __doc__ as THEORY


def _f(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _gpu_profile() -> str:
    profile = available()
    return profile.description if profile else f"none in this install ({PROFILE} is missing)"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def render(summary: Summary, context: dict, plots: Sequence[str] = ()) -> str:
    lines = ["# Tandem benchmark", ""]
    for key in ("date", "command", "machine", "target", "draft", "suite", "plan", "wall_time",
                "raw_runs"):
        if key in context:
            lines.append(f"- **{key.replace('_', ' ')}**: `{context[key]}`"
                         if key == "command" else f"- **{key.replace('_', ' ')}**: {context[key]}")
    lines += ["", "Speedup = decode tokens/s of the speculative run / decode tokens/s of its paired "
              "baseline run (same prompt, target, sampling and constraint, no drafter); e2e = the "
              "same ratio of end-to-end milliseconds per output token, prefill included. Slower = "
              "share of prompts with speedup < 1. Forced = share of output tokens a prompt's grammar "
              "forced (committed without a model). Tok/s = median decode tokens/s, speculative and "
              "plain. GPU profile = median predicted speedup of the same rounds on the measured "
              f"GPU profile: {_gpu_profile()} (bench/benchmark/gpu_profile.py, theory.py).", ""]

    lines += ["## Speedup per category", ""]
    keys = list(dict.fromkeys((r.config, r.sampling) for r in summary.speedups))
    for config, sampling in keys:
        lines += [f"### {config}, {sampling}", ""]
        rows = [[r.category, str(r.speedup.n), _f(r.speedup.median), _f(r.speedup.p10),
                 _f(r.speedup.p90), f"{r.fraction_slower:.0%}" if not math.isnan(r.fraction_slower) else "–",
                 _f(r.e2e_speedup.median), _f(r.acceptance_rate), f"{r.forced_share:.0%}",
                 _f(r.tokens_per_target_call), f"{_f(r.tokens_per_s, 1)} / {_f(r.baseline_tokens_per_s, 1)}",
                 _f(r.gpu_profile)]
                for r in summary.speedups if (r.config, r.sampling) == (config, sampling)]
        lines += _table(["category", "n", "median", "p10", "p90", "slower", "e2e median",
                         "acceptance", "forced", "tokens/target call", "tok/s (spec / plain)",
                         "GPU profile"], rows)

    lines += _sweep(summary) + _later_sections(summary)
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _sweep(summary: Summary) -> list[str]:
    lines = ["## Gamma sweep", "",
              "Latency-optimal gamma: the highest median speedup. Acceptance-optimal gamma: the "
              "highest acceptance rate (usually the smallest gamma, and not the fastest).", ""]
    rows = [[p.drafter, p.policy, p.sampling, str(p.gamma), str(p.speedup.n), _f(p.speedup.median),
             _f(p.speedup.p10), _f(p.speedup.p90), _f(p.acceptance_rate), _f(p.tokens_per_target_call)]
            for p in summary.sweep]
    lines += _table(["drafter", "policy", "sampling", "gamma", "n", "median speedup", "p10", "p90",
                     "acceptance", "tokens/target call"], rows)
    rows = [[b.drafter, b.policy, b.sampling, f"{b.latency_optimal_gamma} ({_f(b.latency_optimal_speedup)}x)",
             f"{b.acceptance_optimal_gamma} ({_f(b.acceptance_optimal_rate)})"] for b in summary.sweep_best]
    return lines + _table(["drafter", "policy", "sampling", "latency-optimal gamma",
                           "acceptance-optimal gamma"], rows)


def _later_sections(summary: Summary) -> list[str]:
    """The Amdahl view, the measured speedup against the prediction, acceptance by position."""
    lines = ["## Amdahl view", "",
              "Prefill share = median share of the baseline's end-to-end time spent on the prompt; "
              "speculation only shortens decoding, so the end-to-end speedup it allows is "
              "1 / (s + (1 - s) / S) for decode speedup S.", ""]
    rows = [[a.config, a.sampling, f"{a.prefill_share:.0%}", _f(a.decode_speedup),
             _f(a.allowed_e2e_speedup), _f(a.measured_e2e_speedup)] for a in summary.amdahl]
    lines += _table(["config", "sampling", "prefill share", "decode speedup (median)",
                     "allowed e2e speedup", "measured e2e speedup (median)"], rows)

    lines += ["## Measured speedup vs the Leviathan et al. prediction", "", "```", THEORY.strip(),
              "```", "",
              "alpha = pooled acceptance rate; c and v = medians over runs, relative to the paired "
              "baseline's decode time per token; gamma = mean drafted length asked per round.", ""]
    rows = [[row.config, row.sampling, _f(row.alpha), _f(row.gamma, 1), _f(row.cost_ratio),
             _f(row.verify_ratio), _f(row.expected_tokens_per_round),
             _f(row.measured_tokens_per_round), _f(row.predicted_speedup),
             _f(row.measured_speedup)] for row in summary.leviathan]
    lines += _table(["config", "sampling", "alpha", "gamma", "c", "v(gamma)", "E predicted",
                     "tokens/round measured", "predicted speedup", "measured speedup"], rows)

    lines += ["## Acceptance by position", ""]
    for c in summary.positions:
        lines.append(f"- **{c.config}, {c.sampling}**: by draft position "
                     + ", ".join(f"{i}: {_f(a)}" for i, a in enumerate(c.by_draft_position))
                     + f"; share of output tokens from accepted drafts per {c.bucket}-token "
                     "stretch of the output: "
                     + ", ".join(_f(a) for a in c.by_output_position))
    return lines + [""]
