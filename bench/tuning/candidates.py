"""The configurations `tandem tune` measures (each a `Candidate`, models/candidate.py, the value a
pairing record keeps): the draft as given, its requantizations to Q8_0, Q4_K and Q4_0
(llama.cpp's quantizer), its trimmed output head, hybrid (prompt lookup, else the draft), early
exit at two depths of the target, prompt lookup alone, and suffix (the longer match in the prompt
or a history of the run's earlier prompts and answers, as the user's history would be); "plain"
(plain decoding) is the reference every one of them is measured against."""
from __future__ import annotations

from models.candidate import Candidate

# Early-exit depths, as fractions of the target's layers: three quarters is the default drafter
# (engine/drafters/early_exit.py); a shallower one is cheaper and agrees less often.
EARLY_EXIT_FRACTIONS = (0.6, 0.75)
QUANTS = ("q8_0", "q4_k", "q4_0")


def default_candidates(has_draft: bool, n_layer: int, policy: str = "adaptive",
                       gamma: int = 8) -> list[Candidate]:
    """Every configuration worth measuring for a target of `n_layer` layers, draft or not.
    Cheap ones first, so a short budget still compares the likeliest winners."""
    out: list[Candidate] = []
    if has_draft:
        out += [Candidate("draft", policy=policy, gamma=gamma),
                Candidate("hybrid", policy=policy, gamma=gamma)]
        out += [Candidate("draft", draft_quant=q, policy=policy, gamma=gamma) for q in QUANTS]
        out.append(Candidate("draft", draft_vocab="trim", policy=policy, gamma=gamma))
    out.append(Candidate("lookup", policy=policy, gamma=gamma))
    out.append(Candidate("suffix", policy=policy, gamma=gamma))
    depths = sorted({max(1, min(n_layer - 1, round(n_layer * f))) for f in EARLY_EXIT_FRACTIONS})
    out += [Candidate("early-exit", early_exit_layers=k, policy=policy, gamma=gamma)
            for k in depths if n_layer > 1]
    return out
