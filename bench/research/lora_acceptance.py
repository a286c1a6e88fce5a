"""Acceptance of the embedded pair when the target carries a LoRA adapter (issue 19): the test
adapter (bench/fakes/lora_adapter.py) at a weak and a strong scale, with the draft model and with the
early-exit draft of the adapted target. Prints a Markdown table.

    .venv/bin/python -m bench.research.lora_acceptance [--scales 0,0.05,1] [--tokens 48]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.benchmark.suite import DEFAULT_SUITE, load_suite
from models import embedded
from bench.fakes.lora_adapter import TEST_EXIT_LAYERS, TEST_LAYERS, acceptance, write_lora


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="0,0.05,1")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=1, help="prompts per category")
    ap.add_argument("--categories", default="code-generation,chat,math")
    ap.add_argument("--early-exit", type=int, default=TEST_EXIT_LAYERS)
    args = ap.parse_args()
    target, draft = embedded.ensure()
    suite = load_suite(DEFAULT_SUITE).select(args.categories.split(","), args.prompts)
    prompts = [p.prompt for p in suite.prompts]
    adapter = write_lora(target, Path(tempfile.mkdtemp()) / "test-lora.gguf", TEST_LAYERS)
    print(f"| scale | draft acceptance | early-exit-{args.early_exit} acceptance | s |")
    print("|---|---|---|---|")
    for scale in [float(s) for s in args.scales.split(",")]:
        lora = [(str(adapter), scale)] if scale else []
        t0 = time.perf_counter()
        a_draft, _ = acceptance(target, draft, lora, "draft", prompts, args.tokens)
        a_ee, _ = acceptance(target, None, lora, "early-exit", prompts, args.tokens,
                             early_exit_layers=args.early_exit)
        print(f"| {scale:g} | {a_draft:.3f} | {a_ee:.3f} | {time.perf_counter() - t0:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
