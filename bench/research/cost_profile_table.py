"""The default on the synthetic cost profiles of tests/test_cost_profiles.py (a GPU, this kind of
2-core CPU, a draft too slow to pay, prompt lookup copying a file; acceptance high, low and
shifting), as a table: over a run of three answers, the default's tokens/s against the best
fixed gamma in hindsight and against plain decoding, and its share of drafting rounds.

  .venv/bin/python -m bench.research.cost_profile_table [shared]

Every figure is exact (a virtual clock). With `shared`, the three answers of a run go through
one pair, so the controller's evidence carries from answer to answer (issue 35); without, each
answer starts from nothing, as before that issue (and as the test runs it).
"""
from __future__ import annotations

import sys

from engine.control.policy import FixedGamma
from engine.events import DoneEvent
from engine.sampling import SamplingParams
from bench.fakes.costed import (CASES, FILE, FIXED, MAX_GAMMA, PATTERNS, SEEDS, TOKENS, script,
                                scripted_pair)

try:
    from engine.generation_config import GenerationConfig
except ImportError:  # trees before issue 35
    from engine.generator import GenerationConfig  # type: ignore[no-redef]


def run(profile, drafter: str, copy: int, pattern: str, policy_of, shared: bool):
    """(tokens/s over the run, share of rounds that drafted)."""
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=MAX_GAMMA,
                              max_tokens=TOKENS)
    pair = None
    ms = tokens = rounds = drafting = 0.0
    for seed in SEEDS:
        s = script(PATTERNS[pattern], seed, copy=copy)
        if pair is None or not shared:
            pair, _ = scripted_pair(profile, s)
        else:
            # The same pair, the next answer's script (the fakes read it).
            fresh, _ = scripted_pair(profile, s)
            pair.target.backend.script = fresh.target.backend.script
            pair.draft_backend.script = fresh.draft_backend.script
        done = [ev for ev in pair.generate(s.prompt_text, config, drafter=drafter, raw=True,
                                           policy=policy_of()) if isinstance(ev, DoneEvent)][0]
        ms += done.stats.total_time_ms
        tokens += done.stats.output_tokens
        rounds += done.stats.rounds
        drafting += sum(g > 0 for g in done.stats.gammas)
    return 1e3 * tokens / ms, drafting / max(rounds, 1)


def main(shared: bool) -> None:
    print(f"Three answers of {TOKENS} tokens per run, greedy, max gamma {MAX_GAMMA}; "
          f"{'one pair for the run (evidence carried)' if shared else 'a fresh pair per answer'}")
    print()
    print("| profile | pattern | default / best fixed γ (best) | default / plain | rounds drafting |")
    print("|---|---|---|---|---|")
    for profile, drafter, copy in CASES:
        for pattern in sorted(PATTERNS):
            default, share = run(profile, drafter, copy, pattern, lambda: None, shared)
            plain, _ = run(profile, "plain", copy, pattern, lambda: None, shared)
            fixed = {g: run(profile, drafter, copy, pattern, lambda g=g: FixedGamma(g), shared)[0]
                     for g in FIXED}
            best = max(fixed, key=lambda g: fixed[g])
            name = f"{profile.name} {drafter}{' copying a file' if copy == FILE else ''}"
            print(f"| {name} | {pattern} | {default / fixed[best]:.3f} (γ {best}) | "
                  f"{default / plain:.3f} | {share:.0%} |")


if __name__ == "__main__":
    main(sys.argv[1:2] == ["shared"])
