"""The negative control's verification rule: the exact rule except that a rejection resamples
from p instead of the residual norm(max(0, p - q)). Its output over-weights tokens the draft
likes, so the exactness check must detect it. Only the exactness check uses it."""
from __future__ import annotations


from engine.acceptance import I32, Verdict, greedy_verify
from engine.sampling import F64, Rng


def biased_verify(p: "F64", q: F64 | None, draft: I32, rng: Rng,
                  greedy: bool) -> Verdict:
    if greedy:
        return greedy_verify(p, draft)
    gamma = len(draft)
    for i in range(gamma):
        x = int(draft[i])
        px = p[i][x]
        qx = q[i][x] if q is not None else 1.0
        if qx > 0.0 and (px >= qx or rng.coin(px / qx)):
            continue
        return Verdict(i, rng.draw(p[i]), "correction")
    return Verdict(gamma, rng.draw(p[gamma]), "bonus")
