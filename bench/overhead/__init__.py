"""The engine's own cost per token (`tandem bench --overhead`): the real `Pair.generate` over
backends that answer at once (bench/fakes/instant.py).

On a GPU a token of a 1.5B target takes 3-5 ms, so every millisecond the engine spends around
its decodes (row transforms, draws, the acceptance rule, bookkeeping) is paid on top. Here both
models are `InstantBackend`s: each decode returns precomputed logit rows at the real vocabulary
size, and the time spent inside decode (copying those rows, as llama.cpp's backend copies its
own) is measured and subtracted, so what is left is the engine's time alone. Times are the
thread's CPU time, so other programs on a shared machine do not count in them.

The rows are shaped like the embedded Qwen2.5 target's (151,936 logits a row: the bulk around
-4 with a spread of 2.5, the top token 16-23 nats up, a few to a few hundred tokens within 10
nats of it, some thousands within 16), drawn once per bank slot; a context picks its slot from
its last two tokens. The draft's bank is the target's with N(0, 0.5) noise added: sampled drafts
are accepted 0.7-0.9 of the time, as the embedded pair's are on code.

The "fresh text" paths are where nothing drafts: each row is rolled by an offset of its position,
so the text never repeats (prompt lookup and the history find nothing to copy), and the draft's
rows by another, so it never agrees with the target (a draft that never pays). What the default
costs there over plain decoding is its bookkeeping alone (issue 35's budget: 0.1 ms a token, 0.2
with a history of 2,000,000 tokens).

The "losing copies" paths are where a copy is on offer nearly every round and always loses: the
text is made of sixteen letters, the prompt holds every pair of them (so the text's last two
tokens always occurred before, and prompt lookup has a copy), and the target never continues a
pair as it was continued before (`CopyRefusingBackend`), so every copy's first token is
rejected. The default should learn that these copies lose and stop drafting them; what it costs
there over plain decoding is its bookkeeping with a copy on offer (issue 35).

The constrained paths (issue 37) run plain decoding, the draft model and the default twice over
the same banks, free and under a JSON schema of the kind agents send (`OVERHEAD_SCHEMA`): the
difference is the constraint's own cost per token, masks on p and q, forced chains and the
matcher's walk over drafts, with the time inside llguidance (the masks' computation, consuming
and rolling back tokens) measured apart. A grammar needs backends that spell text with their own
tokens (llguidance forces canonical tokenizations through `tokenize`): the real Qwen2.5
vocabulary read from a GGUF when one is given (`qwen_spelling`), else a byte-level table padded
to the vocabulary size with distinct 2-3 byte pieces (`byte_spelling`, bench/fakes/spelled.py);
the report names which.

Here: the banks of rows and the losing-copies text (`banks`), the suffix drafter's history and its
timing (`history`), the free paths (`engine_time`) and the constrained ones (`grammar`). The
tables are app/reports/overhead_markdown.py's.
"""
