"""An answer's log probabilities as `tandem generate --logprobs N` reports them: each token's
log probability under the target's own distribution (engine/logprobs.py) with its N most likely
alternatives, as JSON rows (`--json`) or as a table, one token a line. Tokens are shown by
their bytes as JSON strings, so a space, a newline or half a character is visible."""
from __future__ import annotations

import json
from typing import Callable, Sequence

from engine.logprobs import TokenLogprob

PIECE_WIDTH = 14


def rows(logprobs: Sequence[TokenLogprob], piece: Callable[[int], bytes]) -> list[dict]:
    """JSON-ready rows: {"token", "logprob", "top": [{"token", "logprob"}, ...]}."""
    def show(token: int) -> str:
        return piece(token).decode("utf-8", errors="backslashreplace")

    return [{"token": show(lp.token), "logprob": lp.logprob,
             "top": [{"token": show(t), "logprob": v} for t, v in lp.top]} for lp in logprobs]


def table(logprob_rows: Sequence[dict]) -> str:
    """The rows as aligned text: index, token, log probability, then the alternatives."""
    lines = [f"{'#':>5}  {'token':<{PIECE_WIDTH}} {'logprob':>9}  most likely"]
    for i, row in enumerate(logprob_rows):
        top = "  ".join(f"{json.dumps(alt['token'])} {alt['logprob']:.4f}" for alt in row["top"])
        lines.append(f"{i:>5}  {json.dumps(row['token']):<{PIECE_WIDTH}} {row['logprob']:>9.4f}"
                     f"  {top}".rstrip())
    return "\n".join(lines)
