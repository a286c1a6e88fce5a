"""Every constant of the adaptive controller, with where it comes from (docs/design/controller.md
has the measurements). None is tuned to one machine: costs are measured per pair at load, and
these set priors, memories and how sure a choice must be."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerConstants:
    # Acceptance per draft position before any evidence, and its weight in observations: the
    # greedy agreement of a same-family draft one size down (0.5B/1.5B Qwen2.5-Coder: 0.83 after
    # the opening, docs/design/controller.md), rounded down.
    prior: float = 0.7
    prior_weight: float = 2.0
    # Memory of acceptance counts per round: about ten rounds, so the estimate follows easy and
    # hard stretches of text (tests/test_cost_profiles.py's shifting pattern).
    decay: float = 0.9
    # Imagined successes per draft position when choosing how far to draft (not whether to):
    # a short round never tests the positions past it, which otherwise keep their shrunk
    # estimate, so rounds lengthened slowly when the text turned easy (the shifting pattern).
    hope: float = 1.0
    # Step with which measured round times move the calibrated costs.
    rate: float = 0.2
    # A gamma must be predicted to save this share of what its round loses when nothing is
    # accepted (the round's cost over a plain token's): `margin` to carry on, `resume_margin`
    # to start again after plain rounds, when the estimate leans on the target's confidence.
    # In units of the round's own risk, so the same values hold on a flat GPU verify curve and
    # a steep CPU one.
    margin: float = 0.1
    resume_margin: float = 0.3
    # While plain decoding wins, a round may explore: draft `probe_gamma` tokens where the
    # optimistic end of the source's acceptance (posterior mean plus `explore_z` standard
    # deviations) says drafting could pay, while what exploring lost stays within
    # `explore_share` of the plain-decoding time seen (engine/control/controller.py). 1.64 is
    # a one-sided 95% bound; 1% is the budget for exploration over a long run.
    probe_gamma: int = 2
    explore_z: float = 1.64
    explore_share: float = 0.01
    # A copy's key is switched off for the answer (`_loses`) only once it has been seen in this
    # many rounds (drafted, or watched: a plain round judged as the copy's draft would have
    # been); with fewer, its rounds are predicted in full, which costs microseconds, where a
    # wrong switch-off costs the answer's copies (issue 62: one failed 1-token match closed
    # lookup for a whole verbatim edit). With 8, a copy whose first token is accepted 0.9 of the
    # time (what a 16-token copy needs on a steep CPU curve) shows the 4 misses in 8 that could
    # close it with probability 0.5%; one that missed all 8 has an optimistic bound of 0.25.
    lose_after: int = 8
    # A plain round adds `conf_weight` of an observation at acceptance `scale * confidence`
    # (the target's top probability tracks the draft's agreement: 0.99 above 0.97, 0.61 at
    # 0.5-0.7, 0.27 at 0.3-0.5); `scale` starts at 1 with this weight.
    conf_weight: float = 0.5
    scale_prior_weight: float = 8.0
    # A plain round reads the target's confidence once every this many plain rounds (the row's
    # top probability costs about 0.1 ms at 151,936 tokens, a plain greedy token's time), the
    # reading counting for the rounds it stands for.
    confidence_every: int = 4
    # A resumption's catch-up (or hybrid's first model round, which feeds the whole prompt) is
    # spread over at least `horizon` rounds, and over as many as the answer so far would fill,
    # counting at most `horizon_cap` tokens (Gott's rule). With 4, hybrid's lazy prefill kept
    # it plain where the draft paid (48-prompt trace: code generation 1.05x against 1.11x).
    horizon: float = 16.0
    horizon_cap: float = 256.0
    # An answer's first tokens are where a draft fails most (greedy agreement 0.50, 0.73, 0.79
    # at the first three, 0.83 after): the first rounds are judged at no more than these, so
    # they stay plain where a lost round is dear (a CPU) and draft where it is cheap (a GPU).
    opening: tuple[float, ...] = (0.5, 0.73, 0.79)
    # Rounds forced plain at the start of every answer, whatever they would cost (a benchmark
    # and exactness setting: `--opening`).
    opening_plain: int = 0


DEFAULTS = ControllerConstants()
