"""Command-line options shared by every subcommand that loads and runs a pair."""
from __future__ import annotations

import argparse

from engine.backend import ModelConfig
from engine.generator import GenerationConfig
from engine.sampling import SamplingParams


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and hardware")
    g.add_argument("--target", help="target GGUF (default: the embedded Qwen2.5-Coder-1.5B)")
    g.add_argument("--draft", help="draft GGUF, or 'none' for plain decoding "
                   "(default: the embedded Qwen2.5-Coder-0.5B)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for both models")
    g.add_argument("--ctx", type=int, default=4096, help="context length for both models")
    g.add_argument("--gpu-layers", type=int, default=0, help="target layers on the GPU (-ngl)")
    g.add_argument("--draft-gpu-layers", type=int, default=0, help="draft layers on the GPU (-ngld)")
    g.add_argument("--no-budget-check", action="store_true", help="skip the memory fit check")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--gamma", type=int, default=4, help="tokens drafted per round")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def model_configs(args: argparse.Namespace) -> tuple[ModelConfig, ModelConfig | None]:
    from models import embedded
    if args.target is None or args.draft is None:
        # Only assemble the embedded files when one of them is actually used.
        embedded_target, embedded_draft = embedded.ensure()
    target = args.target or str(embedded_target)
    draft_path = args.draft if args.draft is not None else str(embedded_draft)
    tcfg = ModelConfig(path=target, n_ctx=args.ctx, n_threads=args.threads,
                       n_gpu_layers=args.gpu_layers)
    if draft_path == "none":
        return tcfg, None
    return tcfg, ModelConfig(path=draft_path, n_ctx=args.ctx, n_threads=args.threads,
                             n_gpu_layers=args.draft_gpu_layers)


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, seed=args.seed)
    return GenerationConfig(params=params, gamma=args.gamma, max_tokens=args.max_tokens,
                            stop=tuple(args.stop))
