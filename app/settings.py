"""Command-line options shared by every subcommand that loads and runs a pair."""
from __future__ import annotations

import argparse
from typing import Sequence

from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.limits import MAX_THREADS, MIN_CTX, check_hardware
from app.runtime.defaults import (MAX_PARALLEL, CTX, DEFAULT_CHAIN_MIN, DEFAULT_DRAFTER, DEFAULT_GAMMA,
                                  DEFAULT_POLICY, DRAFTERS, FLASH_ATTN, FLASH_ATTN_CHOICES,
                                  GPU_LAYERS, KV_TYPE, KV_TYPES, HISTORY, HISTORY_TOKENS,
                                  LOAD, LOOKUP_NGRAM, NEEDS_DRAFT_MODEL, PLAIN, POLICIES)
from app.runtime.ranges import BY_NAME, parse_text
from app.runtime.request import Offer, RunSpec, resolve
from app.runtime.structured import file_spec, read_file
from app.runtime.open_pair import PairRequest
from app.runtime.tuned import PairingRule, PairingUse, chose_speculation
from engine.rpc import parse_endpoints
from engine.slots import sequences_for
from loading.derived.quantized import CHOICES as QUANT_CHOICES
from loading.options import DRAFT_VOCAB_CHOICES, LoadOptions
from models import embedded, other_stores
from models.cli import add_models_dir_arg
from models.offload import gpu_layers


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and hardware")
    g.add_argument("--target", help="target GGUF: a path or a name from `tandem models list`, "
                   "e.g. an Ollama name like qwen2.5-coder:7b (default: the embedded "
                   "Qwen2.5-Coder-1.5B)")
    g.add_argument("--draft", help="draft GGUF (a path or a name, like --target), or 'none' for "
                   "plain decoding (default: the embedded Qwen2.5-Coder-0.5B)")
    add_models_dir_arg(g)
    g.add_argument("--threads", type=int, default=None,
                   help=f"CPU threads for both models, 1 to {MAX_THREADS} (default: every core)")
    g.add_argument("--ctx", type=int, default=CTX,
                   help=f"context length for both models, {MIN_CTX} up to what the model was "
                   f"trained for (default {CTX})")
    g.add_argument("--batch", type=int, default=512,
                   help="most tokens per llama.cpp decode; longer batches are split (default 512, "
                   "capped at the context length)")
    g.add_argument("--gpu-layers", type=gpu_layers, default=GPU_LAYERS, metavar="auto|all|N",
                   help="target layers on the GPU (-ngl): auto places as many as fit once the "
                   "draft is placed; all (or -1) every one; a number is taken as given "
                   f"(default {GPU_LAYERS})")
    g.add_argument("--draft-gpu-layers", type=gpu_layers, default=GPU_LAYERS, metavar="auto|all|N",
                   help="draft layers on the GPU (-ngld): auto puts the draft whole on the GPU "
                   f"when it fits; all (or -1); a number (default {GPU_LAYERS})")
    g.add_argument("--flash-attn", choices=FLASH_ATTN_CHOICES, default=FLASH_ATTN,
                   help="flash attention for both models: auto is llama.cpp's own choice for a "
                   "model with layers on a GPU and off on the CPU (on there for a quantized KV "
                   f"cache, which needs it) (default {FLASH_ATTN})")
    g.add_argument("--kv-type", choices=KV_TYPES, default=KV_TYPE,
                   help="the KV cache's type for both models: q8_0 and q4_0 take about half "
                   f"and a quarter of f16's memory, and need flash attention (default {KV_TYPE})")
    g.add_argument("--lora", action="append", default=[], metavar="PATH",
                   help="GGUF LoRA adapter applied to the target (repeatable)")
    g.add_argument("--lora-scale", type=float, default=1.0,
                   help="scale of the target's LoRA adapters (default 1)")
    g.add_argument("--draft-lora", action="append", default=[], metavar="PATH",
                   help="GGUF LoRA adapter applied to the draft (repeatable)")
    g.add_argument("--draft-lora-scale", type=float, default=1.0,
                   help="scale of the draft's LoRA adapters (default 1)")
    g.add_argument("--rpc", metavar="HOST:PORT[,...]", default=None,
                   help="spread the target's layers over these RPC workers (`tandem worker` on "
                   "each machine); the draft stays here")
    g.add_argument("--draft-rpc", metavar="HOST:PORT[,...]", default=None,
                   help="RPC workers for the draft (other workers than --rpc's)")
    g.add_argument("--no-budget-check", action="store_true", help="skip the memory fit check")
    g.add_argument("--no-warmup", action="store_true", default=not LOAD.warmup,
                   help="skip the warm-up decode at load (one token on each model, then its "
                   "cache cleared, as llama-server does), which spares the first request the "
                   "device's start-up")
    # Speculation options default to None, "not given" (app/runtime/tuned.py), and resolve to
    # the defaults of app/runtime/defaults.py where they are used.
    g.add_argument("--draft-quant", choices=QUANT_CHOICES, default=None,
                   help="load the draft requantized to Q4_0, derived once and kept in the store: "
                   "auto does it for a draft of more than 5.5 bits per weight on the CPU "
                   f"(default {LOAD.draft_quant})")
    g.add_argument("--draft-vocab", choices=DRAFT_VOCAB_CHOICES, default=None,
                   help="trim: load the draft with a trimmed output vocabulary (derived once and "
                   "kept in the store), cheaper per token on a CPU at some acceptance "
                   f"(default {LOAD.draft_vocab})")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The request's settings: not given (None) unless the command line says, and checked by
    the table every front end uses (app/runtime/ranges.py), not by argparse."""
    g = p.add_argument_group("sampling")
    g.add_argument("--gamma", type=parse_text, default=None,
                   help="tokens drafted per round: fixed gamma, heuristic start, adaptive maximum; "
                   f"0 is plain decoding (default {DEFAULT_GAMMA})")
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens"):
        row = BY_NAME[name]
        g.add_argument(row.cli_option, type=parse_text, default=None,
                       help=f"{row.span()}, {row.meaning} (default {row.default})")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def add_output_args(p: argparse.ArgumentParser) -> None:
    """What `tandem generate` constrains its answer to, and reports of each token."""
    g = p.add_argument_group("structured output")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="FILE", default=None,
                     help="answer with JSON that follows this JSON schema (compact JSON; "
                     "tokens the schema allows alone are committed without a model)")
    one.add_argument("--grammar", metavar="FILE", default=None,
                     help="answer in this grammar: GBNF when the file ends in .gbnf, else Lark "
                     "(llguidance's, with its JSON and regex extensions)")
    row = BY_NAME["top_logprobs"]
    g.add_argument(row.cli_option, dest=row.name, metavar="N", type=parse_text, default=None,
                   help=f"{row.span()}, {row.meaning} (the target's own, at temperature 1; "
                   "printed after the answer)")


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation")
    g.add_argument("--drafter", metavar="{" + ",".join(DRAFTERS) + "}", default=None,
                   help="who drafts: the draft model, prompt lookup, suffix (the longer match in "
                   "the prompt or your past requests), hybrid (a copy from either, else the draft model), "
                   f"early-exit (the target's first layers), or {PLAIN} "
                   f"(default: {DEFAULT_DRAFTER}, or {PLAIN} with --draft none)")
    g.add_argument("--policy", metavar="{" + ",".join(POLICIES) + "}", default=None,
                   help=f"how many tokens to draft each round (default {DEFAULT_POLICY}; "
                   "'plain' never drafts: a control for benchmarks)")
    add_draft_stop_args(g)
    g.add_argument("--lookup-ngram", type=int, default=LOOKUP_NGRAM,
                   help="longest n-gram prompt lookup matches (down to 1; hybrid down to 2)")
    g.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers in the early-exit draft (default: three quarters)")
    add_history_args(g)
    row = BY_NAME["prediction"]
    g.add_argument(row.cli_option, metavar="FILE", default=None,
                   help="the answer you expect, drafted from first where the answer follows it "
                   "(a file you ask to have edited; OpenAI's predicted output); plain decoding "
                   "has nothing to draft with it")


def add_history_args(g) -> None:
    g.add_argument("--no-history", action="store_true", default=not HISTORY,
                   help="neither draft from nor remember past prompts and answers (hybrid and "
                   "suffix copy from them; kept in $TANDEM_HISTORY, user-only; `tandem history "
                   "clear` empties it)")
    g.add_argument("--history-tokens", type=int, default=HISTORY_TOKENS,
                   help="most tokens the history keeps per model vocabulary, least recently "
                   f"used first out (default {HISTORY_TOKENS:,})")


def history_tokens(args: argparse.Namespace) -> int | None:
    """The history's size from add_history_args's options, None with --no-history (or for a
    command without them)."""
    if getattr(args, "no_history", True):
        return None
    return args.history_tokens


def add_draft_stop_args(g) -> None:
    g.add_argument("--draft-p-min", type=float, default=0.0,
                   help="stop drafting before a token the draft gives a probability below this "
                   "(untempered when greedy; 0, the default, never stops)")
    g.add_argument("--draft-chain-min", type=float, default=DEFAULT_CHAIN_MIN,
                   help="stop drafting once the product of the draft's probabilities of its "
                   f"tokens is below this (default {DEFAULT_CHAIN_MIN}; 0 drafts the full gamma)")


def draft_stops(args: argparse.Namespace) -> dict:
    """The draft stopping rules (add_draft_stop_args) by PairRequest's names."""
    return {"p_min": args.draft_p_min, "chain_min": args.draft_chain_min}


def load_options(args: argparse.Namespace, drafters: Sequence[str] = (), early_exit: bool = False,
                 early_exit_layers: int | None = None) -> LoadOptions:
    """What to check and derive at load, from the model options (add_model_args), the drafters
    in use and, for the commands that offer them, the early-exit options."""
    return LoadOptions(check_budget=not args.no_budget_check,
                       early_exit=early_exit or "early-exit" in drafters,
                       early_exit_layers=early_exit_layers,
                       draft_quant=args.draft_quant or LOAD.draft_quant,
                       draft_vocab=args.draft_vocab or LOAD.draft_vocab,
                       warmup=not getattr(args, "no_warmup", not LOAD.warmup))


def pairing_rule(args: argparse.Namespace) -> PairingRule:
    """How `tandem generate` and `serve` treat the pairing record: applied unless speculation
    options or --no-pairing were given (app/runtime/tuned.py)."""
    return PairingRule(chose_speculation=chose_speculation(vars(args)),
                       no_pairing=getattr(args, "no_pairing", False))


def pair_request(args: argparse.Namespace, target: ModelConfig, draft: ModelConfig | None,
                 options: LoadOptions, pairing: PairingRule) -> PairRequest:
    """What app/runtime/open_pair.py opens for a command: its files, load `options` and
    `pairing` rule, with the prompt-lookup, draft-stop and history options it has."""
    return PairRequest(target, draft, options, pairing,
                       lookup_ngram=getattr(args, "lookup_ngram", LOOKUP_NGRAM),
                       history_tokens=history_tokens(args), **draft_stops(args))


def request_settings(args: argparse.Namespace) -> dict:
    """The request settings the command line gives, by name (app/runtime/ranges.py); a command
    without one of the options gives none."""
    given = {name: getattr(args, name, None) for name in
             ("drafter", "policy", "gamma", "temperature", "top_k", "top_p", "min_p", "seed",
              "max_tokens")}
    given["stop"] = getattr(args, "stop", None) or None
    given["history"] = False if getattr(args, "no_history", False) else None
    given["top_logprobs"] = getattr(args, "top_logprobs", None)
    path = getattr(args, "prediction", None)
    given["prediction"] = None if path is None else read_file(path, BY_NAME["prediction"].cli_option)
    return given


def request_offer(args: argparse.Namespace, use: PairingUse | None = None) -> Offer:
    """What a command's request chooses from before the pair loads: every drafter (the pair
    refuses one it cannot offer), plain decoding by default with --draft none, the context
    --ctx asks for, and the pairing record's choice when it applies."""
    default = PLAIN if getattr(args, "draft", None) == "none" else DEFAULT_DRAFTER
    return Offer(DRAFTERS, default, getattr(args, "ctx", None), use.overrides if use else {})


def request_spec(args: argparse.Namespace, use: PairingUse | None = None) -> RunSpec:
    """The command line's RunSpec: its request settings resolved like the page's and the API's,
    with the constraint its --json-schema or --grammar file gives."""
    grammar = file_spec(getattr(args, "json_schema", None), getattr(args, "grammar", None))
    return resolve(request_settings(args), request_offer(args, use),
                   prompt=getattr(args, "prompt", ""), raw=getattr(args, "raw", False),
                   grammar=grammar)


def model_configs(args: argparse.Namespace,
                  chosen: str | None = None) -> tuple[ModelConfig, ModelConfig | None]:
    """Target and draft configs from the model options (add_model_args); an explicit drafter
    `chosen` that does not use the draft model does not load it."""
    draft_arg = "none" if chosen is not None and chosen not in NEEDS_DRAFT_MODEL else args.draft
    batch = args.batch
    # Before the embedded files are assembled (minutes on a first run), not after.
    for layers in (args.gpu_layers, args.draft_gpu_layers):
        check_hardware(args.ctx, args.threads, layers, batch)
    rpc, draft_rpc = rpc_workers(args)
    # A cache sequence per slot of `serve --parallel` and `ui --parallel` (the others: one).
    n_seq = sequences_for(checked_parallel(getattr(args, "parallel", 1)))
    if args.target is None or draft_arg is None:
        # Only assemble the embedded files when one of them is actually used.
        embedded_target, embedded_draft = embedded.ensure()
    target, target_name = (other_stores.resolve(args.target, args.models_dir) if args.target
                           else (embedded_target, ""))
    tcfg = ModelConfig(path=str(target), n_ctx=args.ctx, n_threads=args.threads,
                       n_gpu_layers=args.gpu_layers, n_batch=batch, rpc=rpc,
                       lora=lora_list(args), name=target_name, flash_attn=args.flash_attn,
                       kv_type=args.kv_type, n_seq=n_seq)
    if draft_arg == "none":
        if chosen in NEEDS_DRAFT_MODEL:
            raise SettingsError(f"drafter {chosen!r} needs a draft model; drop --draft none")
        return tcfg, None
    draft, draft_name = (other_stores.resolve(draft_arg, args.models_dir) if draft_arg is not None
                         else (embedded_draft, ""))
    return tcfg, ModelConfig(path=str(draft), n_ctx=args.ctx, n_threads=args.threads,
                             n_gpu_layers=args.draft_gpu_layers, n_batch=batch, rpc=draft_rpc,
                             lora=lora_list(args, "draft_"), name=draft_name,
                             flash_attn=args.flash_attn, kv_type=args.kv_type, n_seq=n_seq)


def checked_parallel(value: int) -> int:
    if not 1 <= value <= MAX_PARALLEL:
        raise SettingsError(f"--parallel must be between 1 and {MAX_PARALLEL}, got {value}")
    return value


def lora_list(args: argparse.Namespace, prefix: str = "") -> tuple[tuple[str, float], ...]:
    """The (path, scale) adapters of the target, or of the draft with prefix "draft_"."""
    scale = getattr(args, f"{prefix}lora_scale", 1.0)
    return tuple((str(p), float(scale)) for p in getattr(args, f"{prefix}lora", None) or ())


def rpc_workers(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The target's and the draft's RPC workers; a worker serves one client at a time, so the
    two lists may not share one."""
    rpc = parse_endpoints(args.rpc)
    draft_rpc = parse_endpoints(args.draft_rpc)
    shared = sorted(set(rpc) & set(draft_rpc))
    if shared:
        raise SettingsError(f"worker {shared[0]} is in both --rpc and --draft-rpc; a worker "
                            "serves one model at a time, start another for the draft")
    return rpc, draft_rpc
