"""Monte Carlo on the default path, end to end: answers through `Pair.generate` with the
app's default drafter (hybrid: prompt lookup, else the draft model with its chain stop) and
policy (adaptive, its opening judged at the opening's acceptance, calibrated on first use, batches padded), each
reduced to the pair of tokens at positions k-1, k for k = 0..5, and compared one-sample with the
fake's exact law of those pairs (chi-square, Bonferroni over the six positions). The old trim,
wrapped around the same draft model, is the negative control and must fail.

Sized by the power each needs (`smallest_detectable_tv`, the least bias caught with probability
0.8): in `scripts/test`, 5,000 answers see a bias of 0.029 and the old trim, caught at p ~ 1e-15
with 5,000, runs 2,000; with `--all`, 20,000 answers see 0.015, under the 0.02 the project
claims. The exact enumeration (tests/test_exactness_enumeration.py) is the default guard; this
test checks the whole path around it, the calibrated and padded controller included.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.transform import probabilities
from bench.fakes.table import TableFake, VirtualClock
from tests.old_shortcuts import OldTrim

V, EOG, POSITIONS = 8, 7, 6
# Peaked rows, as a language model's mostly are: the target is often sure of its next token.
SCALE = 2.0
NOISE = 0.8
ALPHA = 1e-3
# (answers, the bias they must be able to see): the default run, and --all's.
QUICK = (5_000, 0.03)
FULL = (20_000, 0.02)
CONTROL_DRAWS = 2_000
PARAMS = SamplingParams(temperature=0.7, top_p=0.95)
TEXT = "bcdefgbcdefg"  # tokens 1-6 twice: prompt lookup finds matches in the answer too
END = V * V  # the state index of an ended answer


# A CPU-like cost profile on a virtual clock (an extra verify row costs 0.2-0.3 of a target
# token, the draft a fifth of one): the adaptive default speculates, and its stopping rule has
# verify width to save, which is where the old trim biased the output.
VERIFY = [10.0, 13.0, 15.0, 17.0, 19.0, 21.0, 23.0, 25.0, 27.0, 29.0]
DRAFT = [2.0, 2.4, 2.8, 3.2, 3.6, 4.0, 4.4, 4.8, 5.2, 5.6]


def pair() -> Pair:
    clock = VirtualClock()
    return Pair(TableFake(seed=4, scale=SCALE, eog=EOG, clock=clock, cost=VERIFY),
                TableFake(seed=4, scale=SCALE, noise=NOISE, eog=EOG, clock=clock, cost=DRAFT),
                clock=clock.now)


def exact_pair_laws(target: TableFake, prompt: list[int]) -> np.ndarray:
    """[POSITIONS, V*V + 1]: the law of (x_{k-1}, x_k), or END once the answer has ended, at
    each position k (x_{-1} is the prompt's last token). The fake's rows depend on the last two
    tokens only, so the answer is a Markov chain on those pairs with END absorbing."""
    trans = np.zeros((V * V + 1, V * V + 1))
    trans[END, END] = 1.0
    for a in range(V):
        for b in range(V):
            p = probabilities(target._row([a, b]), PARAMS)
            for c in range(V):
                trans[a * V + b, END if c == EOG else b * V + c] += p[c]
    state = np.zeros(V * V + 1)
    state[prompt[-2] * V + prompt[-1]] = 1.0
    laws = []
    for _ in range(POSITIONS):
        state = state @ trans
        laws.append(state)
    return np.array(laws)


def observed_states(tokens: tuple[int, ...], prompt: list[int]) -> list[int]:
    seq = [prompt[-1], *tokens]
    return [seq[k] * V + seq[k + 1] if k < len(tokens) else END for k in range(POSITIONS)]


def draw(p: Pair, drafter: str, n: int) -> tuple[np.ndarray, list[int], int]:
    prompt = p.tokens_for(TEXT, raw=True)
    counts = np.zeros((POSITIONS, V * V + 1))
    drafted_at = [0] * POSITIONS
    drafted = 0
    for seed in range(n):
        config = GenerationConfig(params=SamplingParams(temperature=PARAMS.temperature,
                                                        top_p=PARAMS.top_p, seed=seed),
                                  gamma=4, max_tokens=POSITIONS + 2)
        done = [ev for ev in p.generate(TEXT, config, drafter=drafter, raw=True)
                if isinstance(ev, DoneEvent)][0]
        for k, s in enumerate(observed_states(done.tokens, prompt)):
            counts[k, s] += 1
        for k, origin in enumerate(done.stats.origins[:POSITIONS]):
            drafted_at[k] += origin == "draft"
        drafted += done.stats.drafted_tokens
    return counts, drafted_at, drafted


def p_values(counts: np.ndarray, laws: np.ndarray) -> list[float]:
    out = []
    for obs, law in zip(counts, laws):
        exp = law * obs.sum()
        assert obs[exp == 0].sum() == 0, "an answer the target gives probability zero"
        keep = exp >= 5
        o = np.append(obs[keep], obs[~keep].sum())
        e = np.append(exp[keep], exp[~keep].sum())
        if e[-1] == 0:
            o, e = o[:-1], e[:-1]
        out.append(float(stats.chisquare(o, e).pvalue))
    return out


def smallest_detectable_tv(laws: np.ndarray, n: int, alpha: float, power: float = 0.8) -> float:
    """The TV of the least detectable bias of a simple kind (mass moved between the two likeliest
    pairs at one position) that this test catches with `power`: the chi-square noncentrality
    n * sum(delta^2 / p) must reach the level that gives it."""
    from scipy.optimize import brentq
    tvs = []
    for law in laws:
        top = np.sort(law)[-2:]
        dof = int(np.count_nonzero(law * n >= 5))
        crit = stats.chi2.ppf(1 - alpha / POSITIONS, dof)
        lam = brentq(lambda x: stats.ncx2.sf(crit, dof, x) - power, 1e-6, 1e6)
        tvs.append(np.sqrt(lam / (n * (1 / top[0] + 1 / top[1]))))
    return float(min(tvs))


@pytest.fixture(scope="module")
def laws() -> np.ndarray:
    p = pair()
    return exact_pair_laws(p.target.backend, p.tokens_for(TEXT, raw=True))


@pytest.mark.parametrize("size", [pytest.param(QUICK, id="5k"),
                                  pytest.param(FULL, id="20k", marks=pytest.mark.long)])
def test_the_default_path_follows_the_targets_law(laws, size):
    draws, sees = size
    assert smallest_detectable_tv(laws, draws, ALPHA) < sees
    p = pair()
    assert p.default_drafter == "hybrid"
    counts, drafted_at, drafted = draw(p, "hybrid", draws)
    # Speculation really happened: drafts were sent at positions 3 and later (the first rounds
    # are judged at the opening acceptance and may stay plain).
    assert drafted > 0 and all(n > 0 for n in drafted_at[3:])
    assert min(p_values(counts, laws)) > ALPHA / POSITIONS


def test_the_old_trim_on_the_default_path_is_caught(laws):
    p = pair()
    cal = p.calibration("hybrid", 4)
    # The default hybrid's parts (Pair's lookup for hybrid wants 2-grams or longer), with the
    # old trim around the pair's draft model.
    lookup = PromptLookupDrafter(ngram_max=3, ngram_min=2, is_eog=p.target.backend.is_eog)
    p.add_drafter("old-trim", HybridDrafter(lookup, OldTrim(p.drafter("draft"), cal.verify_ms)))
    p.knowledge["old-trim"] = cal
    counts, _, drafted = draw(p, "old-trim", CONTROL_DRAWS)
    assert drafted > 0
    assert min(p_values(counts, laws)) < ALPHA / POSITIONS
