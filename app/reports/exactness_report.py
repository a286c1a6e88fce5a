"""The exactness report: console lines, Markdown and JSON of an `ExactnessReport`."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from bench.exactness.check import ExactnessReport, SettingResult
from bench.exactness.greedy import NEAR_TIE_GAP


def verdict(r: SettingResult) -> str:
    if not r.exercised:
        return "NOT EXERCISED (nothing drafted)"
    return "PASS" if r.passed else "FAIL"


def setting_line(r: SettingResult) -> str:
    worst = min(r.comparisons, key=lambda c: c.p_value)
    parts = [f"{c.statistic}: p={c.p_value:.3g} TV={c.tv:.3f} [{c.tv_low:.3f}, {c.tv_high:.3f}], "
             f"drafted in {share:.0%}, detects TV >= {d:.3f}"
             for c, share, d in zip(r.comparisons, r.drafted_share, r.detectable)]
    bias = f", bias {r.bias_tv:.3f} per verified round" if r.rule == "biased" else ""
    return (f"{verdict(r)}  {r.name} (rule {r.rule}, acceptance {r.acceptance_rate:.2f}{bias}; "
            f"worst p={worst.p_value:.3g} vs threshold {r.threshold:.3g}; smallest detectable "
            f"TV {r.smallest_detectable:.3f})\n    " + "\n    ".join(parts))


def console_lines(rep: ExactnessReport) -> list[str]:
    lines = [setting_line(r) for r in rep.results]
    if rep.control is not None:
        caught = ("caught (expected FAIL)" if not rep.control.passed else
                  "NOT caught: too few samples for its bias, or a draft so close to the target "
                  "that the biased rule hardly differs")
        lines.append(f"negative control {caught}:\n  " + setting_line(rep.control))
    if rep.greedy is not None:
        g = rep.greedy
        div = [f"{c.first_divergence} (gap {c.gap:.2f})" for c in g.cases
               if c.first_divergence is not None]
        lines.append(f"greedy agreement: {g.identical}/{len(g.cases)} identical ({g.rate:.0%})"
                     + (f"; first divergence at token {', '.join(div)}" if div else "")
                     + (f"; {g.unexplained} NOT at a near-tie (logit gap >= {NEAR_TIE_GAP:.2f})"
                        if g.unexplained else ""))
    lines.append("OVERALL: " + ("PASS" if rep.passed else "FAIL"))
    return lines


def _setting_md(r: SettingResult) -> list[str]:
    out = [f"### {r.name}: **{verdict(r)}**", "",
           f"Rule {r.rule}; params {r.params}; speculative acceptance rate {r.acceptance_rate:.2f} "
           f"({r.drafted} tokens drafted); p-value threshold {r.threshold:.4g}; smallest "
           f"detectable TV {r.smallest_detectable:.3f}"
           + (f"; measured bias {r.bias_tv:.3f} per verified round" if r.rule == "biased" else "")
           + f"; {r.seconds:.0f} s.", "",
           "| statistic | drafted there | n direct | n speculative | categories (pooled) | chi2 | "
           "dof | p-value | TV | TV 95% CI (bootstrap) | TV from noise alone (95th pct) | "
           "detectable TV (power 0.8) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {c.statistic} | {share:.0%} | {c.n_a} | {c.n_b} | {c.categories} | {c.chi2:.2f} | "
            f"{c.dof} | {c.p_value:.4g} | {c.tv:.3f} | [{c.tv_low:.3f}, {c.tv_high:.3f}] | "
            f"{c.tv_noise:.3f} | {d:.3f} |"
            for c, share, d in zip(r.comparisons, r.drafted_share, r.detectable)]
    return out + [""]


def markdown(rep: ExactnessReport, context: dict) -> str:
    p = rep.plan
    lines = ["# Tandem exactness report", ""]
    for key in ("date", "command", "machine", "target", "draft", "prompt", "wall_time"):
        if key in context:
            lines.append(f"- **{key.replace('_', ' ')}**: `{context[key]}`" if key in ("command", "prompt")
                         else f"- **{key.replace('_', ' ')}**: {context[key]}")
    lines += [f"- **samples per arm**: {p.samples}; gamma {p.gamma}; {p.tokens} tokens per "
              f"answer, positions {p.first}-{p.tokens - 1} compared; alpha {p.alpha} (Bonferroni "
              f"over the positions); seed {p.seed}",
              f"- **overall**: {'PASS' if rep.passed else 'FAIL'}", "",
              "Each setting compares answers of plain target sampling (direct) with speculative "
              "sampling on the same prompt: at each compared position k, the law of the tokens "
              "at k-1 and k. Chi-square homogeneity tests pool rare categories; a setting passes "
              "when every p-value is at least the threshold. 'Drafted there' is the share of "
              "speculative answers whose token at k came from a draft; 'detectable TV' the "
              "smallest bias (mass moved between the two likeliest pairs) the test catches with "
              "probability 0.8. Speculative verification scores drafted tokens in one batch and "
              "llama.cpp's batch logits differ from one-token logits (docs/EXACTNESS.md), so a "
              "test large enough could see numerics as well as the rule.", "", "## Settings", ""]
    for r in rep.results:
        lines += _setting_md(r)
    if rep.control is not None:
        lines += ["## Negative control", "",
                  "The same comparison with a deliberately biased rule (on a rejection, with a "
                  "probability tuned so that each verified round's first token is off by "
                  f"TV {p.control_tv:g}, resample from p instead of the residual). It must FAIL, "
                  "which shows the sample counts are large enough to see a bias of that size: "
                  + ("**caught**." if not rep.control.passed else
                     "**not caught**: too few samples for its bias, or a draft so close to the "
                     "target that the biased rule hardly differs."),
                  ""] + _setting_md(rep.control)
    if rep.greedy is not None:
        g = rep.greedy
        lines += ["## Greedy agreement", "",
                  f"{g.identical} of {len(g.cases)} prompts give identical greedy outputs with and "
                  f"without speculation ({g.rate:.0%}), {p.greedy_tokens} tokens each. Divergences "
                  "come from batch-versus-single-token logits at near-ties: the target's logit gap "
                  f"between the two tokens must be under {NEAR_TIE_GAP:.2f}.", "",
                  "| prompt | plain tokens | speculative tokens | first divergence | logit gap |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c.prompt} | {c.plain_tokens} | {c.speculative_tokens} | "
                  f"{'identical' if c.first_divergence is None else c.first_divergence} | "
                  f"{'' if c.gap is None else f'{c.gap:.3f}' + ('' if c.near_tie else ' NOT a near-tie')} |"
                  for c in g.cases]
        lines.append("")
    return "\n".join(lines)


def write(rep: ExactnessReport, context: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "exactness.md"
    md.write_text(markdown(rep, context), encoding="utf-8")
    js = out / "exactness.json"
    payload = {"context": context, "passed": rep.passed, "plan": asdict(rep.plan),
               "results": [{**asdict(r), "passed": r.passed} for r in rep.results],
               "control": {**asdict(rep.control), "passed": rep.control.passed} if rep.control else None,
               "greedy": {"rate": rep.greedy.rate, "cases": [asdict(c) for c in rep.greedy.cases]}
               if rep.greedy else None}
    js.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    return [md, js]
