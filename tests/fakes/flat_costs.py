"""A synthetic flat cost curve for tests of the controller's arithmetic: nine rows cost barely
more than one (1.00 to 1.10) and the draft a tenth of the target, a target token 10 virtual ms.
No machine measured it; GPU figures use the measured profile (bench/benchmark/gpu_profile.py)."""
from __future__ import annotations

from bench.fakes.costed import Profile

FLAT_RATIOS = (1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.08, 1.10)
FLAT = Profile("flat", tuple(10.0 * r for r in FLAT_RATIOS), tuple(1.0 * r for r in FLAT_RATIOS),
               "a synthetic flat curve (tests/fakes/flat_costs.py), a target token 10 ms")
