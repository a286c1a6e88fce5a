"""The first request's time to first token with and without the warm-up at load
(loading/warmup.py): each run is a fresh process that loads the pair, then times two short
requests; alternate the two modes and compare the first request's TTFT (and the load's time).

  .venv/bin/python -m bench.research.warmup_ttft on|off [--drafter plain] [--target P --draft P]
      [--draft none] [--flash-attn auto|on|off]

Without --target and --draft, the embedded pair; `--draft none` loads the target alone. On
Mesa's lavapipe: `GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python -m bench.research.warmup_ttft
on --target SMALL.gguf --draft none --ctx 256 --flash-attn off`. Prints one JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import time

from engine.backend import ModelConfig
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from loading.load import load_pair
from loading.options import LoadOptions

PROMPTS = ("def fibonacci(n):", "class Stack:")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("warmup", choices=("on", "off"))
    ap.add_argument("--drafter", default="plain")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    args = ap.parse_args(argv)
    target, draft = args.target, args.draft
    if target is None or draft is None:
        from models import embedded
        t, d = embedded.ensure()
        target, draft = target or str(t), draft or str(d)
    started = time.perf_counter()
    def config(path: str) -> ModelConfig:
        return ModelConfig(path, n_ctx=args.ctx, flash_attn=args.flash_attn)

    pair = load_pair(config(target), None if draft == "none" else config(draft),
                     LoadOptions(warmup=args.warmup == "on", draft_quant="off"))
    out: dict = {"warmup": args.warmup, "drafter": args.drafter,
                 "load_s": round(time.perf_counter() - started, 2)}
    try:
        for i, prompt in enumerate(PROMPTS, 1):
            for ev in pair.generate(prompt, GenerationConfig(gamma=4, max_tokens=4),
                                    drafter=args.drafter):
                if isinstance(ev, DoneEvent):
                    out[f"ttft_ms_{i}"] = round(ev.stats.ttft_ms, 1)
    finally:
        pair.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
