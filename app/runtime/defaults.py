"""The names and defaults users see, in one place: the CLI's options, the app's controls and
the API's fields all read them from here, so `tandem generate`, the page and `tandem serve`
start from the same settings. What the engine falls back on when nobody says (the default
drafter, the draft's chain stop) is the engine's, and named here for the app."""
from __future__ import annotations

from engine.attention import DEFAULT_FLASH_ATTN, DEFAULT_KV_TYPE, FLASH_ATTN, KV_TYPES
from app.runtime.overflow import DROP_OLDEST, STOP
from engine.drafters.base import PLAIN, plain_alias
from engine.pair import DEFAULT_CHAIN_MIN, DEFAULT_DRAFTER
from engine.control.registry import POLICIES
from engine.generation_config import COPY_MAX
from engine.sampling import SamplingParams
from loading.options import LoadOptions
from models.offload import AUTO

__all__ = ["ADAPT_DECLINE_ABOVE", "COPY_MAX", "CTX", "DEFAULT_CHAIN_MIN", "DEFAULT_DRAFTER", "DEFAULT_GAMMA", "DEFAULT_MAX_TOKENS",
           "DEFAULT_POLICY", "DRAFTERS", "FLASH_ATTN", "FLASH_ATTN_CHOICES", "GPU_LAYERS", "KV_TYPE",
           "KV_TYPES", "HISTORY", "HISTORY_TOKENS", "LOAD", "LOOKUP_NGRAM", "NEEDS_DRAFT_MODEL",
           "MAX_PARALLEL", "OVERFLOW", "OVERFLOW_API", "PARALLEL", "PLAIN", "POLICIES",
           "REASONING_FORMAT", "REASONING_FORMATS", "REASONING_NONE", "SAMPLING", "SPECULATION_OPTIONS",
           "SYSTEM_PRESETS", "plain_alias"]

# PLAIN ("plain") is the one word users see for no speculation: the drafter of plain decoding,
# a generation's mode and a token's origin (engine/drafters/base.py). The control policy that
# runs the speculative path without drafting is "plain" too.
# Drafters by the names users choose them by; `Pair` offers them under the same names.
DRAFTERS = ("draft", PLAIN, "lookup", "suffix", "hybrid", "early-exit")
# Drafters that need the separate draft model loaded.
NEEDS_DRAFT_MODEL = ("draft", "hybrid")

DEFAULT_POLICY = "adaptive"
# Gamma when not given: the fixed gamma, the heuristic's start, the adaptive maximum (and 1 for
# the control that never drafts, where it only sizes the calibration).
DEFAULT_GAMMA = {"fixed": 4, "heuristic": 4, "adaptive": 8, "plain": 1}
# Under the adaptive policy gamma caps the draft model only: a copy (prompt lookup, the history,
# a client's prediction) drafts up to COPY_MAX tokens (the engine's, engine/generation_config.py),
# as far as its match and the measured verify curve pay. A fixed policy caps copies at its gamma.

# Sampling when not given: greedy, nothing truncated (SamplingParams' own defaults), and the
# longest answer.
SAMPLING = SamplingParams()
DEFAULT_MAX_TOKENS = 256
# The longest n-gram prompt lookup matches.
LOOKUP_NGRAM = 3
# The history of past prompts and answers that hybrid and suffix draft from: on unless turned
# off (--no-history, the app's setting), and at most this many tokens per tokenizer and owner
# (16 bytes each in memory, 4 on disk), least recently used first out.
HISTORY = True
HISTORY_TOKENS = 2_000_000

# When a chat outgrows the context (app/runtime/overflow.py): the page leaves out the oldest
# turns and keeps the system prompt, as Ollama does; the API refuses, as llama-server does,
# unless a request asks for a policy (`context_overflow`).
OVERFLOW = DROP_OLDEST
OVERFLOW_API = STOP

# A reasoning model's thinking (app/runtime/reasoning.py), in llama-server's words
# (--reasoning-format): "deepseek" returns it apart from the answer (the API's
# `reasoning_content` and reasoning items, the page's folded thoughts) where the chat template
# thinks; "none" leaves the tags in the answer's text.
REASONING_DEEPSEEK, REASONING_NONE = "deepseek", "none"
REASONING_FORMATS = (REASONING_DEEPSEEK, REASONING_NONE)
REASONING_FORMAT = REASONING_DEEPSEEK

# The page's system prompt presets, by the name the menu shows; a chat keeps its own prompt.
SYSTEM_PRESETS = {
    "none": "",
    "helpful assistant": "You are a helpful assistant.",
    "concise coder": "You are an expert programmer. Answer with the code first, then at most "
                     "two sentences.",
    "code reviewer": "You review code: name each bug or risk with its line, then show the fix.",
    "teacher": "You explain step by step, with a small example, for someone learning.",
}

# Layers on the GPU for target and draft when not given: "auto", the loading plan places them
# (the draft whole first, then the target's layers, caches and buffers, a margin kept;
# loading/plan.py). "all" or a number is taken as given.
GPU_LAYERS = AUTO
# The context length for both models when not given.
CTX = 4096
# Generations `tandem serve` and `tandem ui` decode together, each on its own slot (its own
# sequence of both caches, engine/slots.py), as LM Studio's and llama-server's 4 parallel slots;
# 1: one at a time, the rest wait. `tandem calibrate` measures the verify curve to the width that
# many sequences drafting the largest gamma reach.
PARALLEL = 4
# The most slots: each holds a context's cache.
MAX_PARALLEL = 64
# Flash attention ("auto", "on", "off") and the KV cache's type ("f16", "q8_0", "q4_0") for
# both models when not given (engine/attention.py); FLASH_ATTN_CHOICES and KV_TYPES the words.
FLASH_ATTN, FLASH_ATTN_CHOICES = DEFAULT_FLASH_ATTN, FLASH_ATTN
KV_TYPE = DEFAULT_KV_TYPE

# What a load checks and derives when not given (LoadOptions' own defaults).
LOAD = LoadOptions()
# The options a pairing record chooses (app/runtime/tuned.py): any of them given on the command
# line keeps the record from applying. Their command-line defaults are None, "not given".
SPECULATION_OPTIONS = ("drafter", "policy", "gamma", "draft_quant", "draft_vocab",
                       "early_exit_layers")
# `tandem adapt` (and the Models tab's action) declines a pair whose base draft already accepts
# more than this per position at greedy on the user's requests (too little left to gain: at
# 0.911, +0.05 would remove 56% of the rejections left), unless forced (`--force`).
ADAPT_DECLINE_ABOVE = 0.85
