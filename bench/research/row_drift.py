"""Does a verify row's numerics depend on the batch width it is decoded at?

The verify batch of a round is [last committed token] + drafted tokens, padded to a cheaper
width (engine/widths.py). How many tokens are drafted depends on the drafted values (the chain
and end-of-generation stops read the tokens already drawn), so if the target's rows changed
with the batch width, the row that judges a drafted token would depend on that token. This
decodes the same positions on the real target at every real count n = 1..9 and every padded
width W = n..9, and compares each row with the same row decoded (a) at the unpadded width n and
(b) in the widest batch, reporting max |delta logit| and the total variation at T = 0.7; then,
at a fixed width, whether the rows before position k change when the tokens after it do (the
generator fixes a sampled draft's verify width before drafting, which is exact only if not).

  .venv/bin/python -m bench.research.row_drift [N_CONTEXTS]
"""
from __future__ import annotations

import sys

import numpy as np

from engine.backend import ModelConfig
from engine.llama.backend import LlamaBackend
from engine.sampling import SamplingParams
from engine.transform import probabilities
from engine.session import Session
from models import embedded

TEXTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib",
         "The history of computing in Europe begins with the mechanical calculators of Pascal",
         "SELECT name, COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.",
         "Translate to French: The weather is nice today, so we will walk to the",
         "import numpy as np\n\ndef softmax(x):\n    z = x - x.max()\n    e = np.exp(z)\n"]
MAX_W = 9


def main(n_contexts: int) -> None:
    target_path, _ = embedded.ensure()
    backend = LlamaBackend(ModelConfig(str(target_path), n_ctx=512, n_threads=2))
    session = Session(backend)
    params = SamplingParams(temperature=0.7)
    worst_pad = worst_count = worst_later = 0.0
    identical_later = later = 0
    tv_pad = tv_count = 0.0
    identical_pad = identical_count = compared = 0
    for text in TEXTS[:n_contexts]:
        tokens = backend.tokenize(text, True, False)
        context, batch = tokens[:-MAX_W], tokens[-MAX_W:]
        session.rollback(0)
        session.extend(context)
        base = session.n_past
        rows: dict[tuple[int, int], np.ndarray] = {}
        for n in range(1, MAX_W + 1):
            for width in range(n, MAX_W + 1):
                session.rollback(base)
                rows[n, width] = session.extend(batch[:n], rows=range(n), pad_to=width)
        for width in range(2, MAX_W + 1):
            for k in range(1, width):
                session.rollback(base)
                other = batch[:k] + [(t * 7 + 13) % backend.n_vocab for t in batch[k:width]]
                d = np.abs(session.extend(other, rows=range(k)) - rows[width, width][:k])
                worst_later = max(worst_later, float(d.max()))
                identical_later += int(not d.any())
                later += 1
        session.rollback(base)
        for n in range(1, MAX_W + 1):
            for width in range(n + 1, MAX_W + 1):
                d = np.abs(rows[n, width] - rows[n, n])
                worst_pad = max(worst_pad, float(d.max()))
                identical_pad += int(not d.any())
                for i in range(n):
                    p, q = probabilities(rows[n, width][i], params), probabilities(rows[n, n][i], params)
                    tv_pad = max(tv_pad, 0.5 * float(np.abs(p - q).sum()))
            # The same positions in the widest unpadded batch: row i of a batch of n real tokens
            # against row i of a batch of MAX_W real tokens.
            d = np.abs(rows[n, n] - rows[MAX_W, MAX_W][:n])
            worst_count = max(worst_count, float(d.max()))
            identical_count += int(not d.any())
            for i in range(n):
                p = probabilities(rows[n, n][i], params)
                q = probabilities(rows[MAX_W, MAX_W][i], params)
                tv_count = max(tv_count, 0.5 * float(np.abs(p - q).sum()))
            compared += 1
    pads = sum(MAX_W - n for n in range(1, MAX_W + 1)) * n_contexts
    print(f"padded vs unpadded, same real tokens: {identical_pad}/{pads} batches bit-identical, "
          f"max |dlogit| {worst_pad:.4f}, max TV at T=0.7 {tv_pad:.5f}")
    print(f"n real tokens vs {MAX_W}, same positions: {identical_count}/{compared} bit-identical, "
          f"max |dlogit| {worst_count:.4f}, max TV at T=0.7 {tv_count:.5f}")
    print(f"same width, tokens after row k changed: {identical_later}/{later} bit-identical, "
          f"max |dlogit| {worst_later:.4f}")
    backend.close()


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else len(TEXTS))
