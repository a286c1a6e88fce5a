"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.benchmark.aggregate import Summary, sampling_label  # noqa: E402
from bench.benchmark.records import RunRecord  # noqa: E402


def speedup_by_category(records: Sequence[RunRecord], path: Path) -> Path:
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.role == "speculative" and r.speedup is not None:
            groups[f"{r.config}, {sampling_label(r)}"][r.category].append(r.speedup)
    fig, axes = plt.subplots(len(groups) or 1, 1, figsize=(8, 3.2 * max(len(groups), 1)),
                             squeeze=False)
    for ax, (name, by_cat) in zip(axes[:, 0], groups.items()):
        cats = list(by_cat)
        ax.boxplot([by_cat[c] for c in cats], whis=(10, 90), showfliers=True)
        ax.set_xticks(range(1, len(cats) + 1), cats, rotation=15)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel("speedup over baseline")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def swept(summary: Summary) -> bool:
    """Whether the run tried more than one gamma for some drafter, policy and sampling: else a
    sweep plot would show single points, a figure with nothing to read."""
    seen: dict[tuple, set[int]] = defaultdict(set)
    for p in summary.sweep:
        seen[(p.drafter, p.policy, p.sampling)].add(p.gamma)
    return any(len(g) > 1 for g in seen.values())


def gamma_sweep(summary: Summary, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    lines: dict[str, list] = defaultdict(list)
    for p in summary.sweep:
        lines[f"{p.drafter} {p.policy}, {p.sampling}"].append(p)
    for name, pts in lines.items():
        g = [p.gamma for p in pts]
        ax.plot(g, [p.speedup.median for p in pts], marker="o", label=name)
        ax.fill_between(g, [p.speedup.p10 for p in pts], [p.speedup.p90 for p in pts], alpha=0.15)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("gamma (tokens drafted per round)")
    ax.set_ylabel("speedup (median, p10–p90 band)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def acceptance_by_position(summary: Summary, path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c in summary.positions:
        name = f"{c.config}, {c.sampling}"
        left.plot(range(len(c.by_draft_position)), c.by_draft_position, marker="o", label=name)
        right.plot([i * c.bucket for i in range(len(c.by_output_position))], c.by_output_position,
                   marker=".", label=name)
    left.set_xlabel("draft position in the round")
    left.set_ylabel("acceptance rate")
    left.set_ylim(0, 1.02)
    right.set_xlabel("output token index (start of stretch)")
    right.set_ylabel("share of tokens from accepted drafts")
    right.set_ylim(0, 1.02)
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
