"""What might make speculation pay on this machine, from a pair's measured ceiling
(bench/ceiling.py): the advice `tandem calibrate` prints and the page's Models tab shows.
"""
from __future__ import annotations

from bench.ceiling import TYPICAL_ACCEPTANCE, Ceiling

# Why measuring the ceiling does not use the pairing record: the costs are the pair's as given.
MEASURED_AS_GIVEN = "calibrate measures the pair as given"


def suggestions(c: Ceiling, has_draft: bool) -> list[str]:
    """What might make speculation pay here, from the ceiling's figures."""
    out = []
    if has_draft and c.model_pays:
        return out
    if c.lookup_pays:
        g = c.best(c.lookup_typical)
        out.append(f"prompt lookup (--drafter lookup, or the default hybrid, which copies where "
                   f"the answer repeats the prompt: code edits, quoting): "
                   f"{c.lookup_typical[g]:.2f}x at gamma {g} when copies are right "
                   f"{TYPICAL_ACCEPTANCE:.0%} of the time")
    if c.draft_must_cost_under > 0:
        out.append(f"a smaller or requantized draft (--draft-quant q4_0, --draft-vocab trim, or "
                   f"a smaller model of the same family): it must cost under "
                   f"{c.draft_must_cost_under:.2f} of a target token to pay at acceptance "
                   f"{TYPICAL_ACCEPTANCE}" + (f"; this one costs {c.draft_relative:.2f}"
                                              if has_draft else ""))
    out.append("a GPU (--gpu-layers): there verifying several tokens costs about as much as "
               "one, so even a modest draft pays")
    return out
