"""The engine-overhead benchmark (bench/benchmark/overhead.py, `tandem bench --overhead`) run
against another tree's engine, for a before/after table:

  PYTHONPATH=OLD_TREE .venv/bin/python research/overhead_tree.py [MAX_TOKENS] [REPEATS] [PATHS]

PATHS: comma-separated labels of the harness's paths (default: every path without a history).

The harness is loaded from this tree's file; everything it imports (Pair, the generator, the
sampling code) comes from the tree on PYTHONPATH.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "engine" / "tools" / "benchmark" / "overhead.py"
MACHINE = Path(__file__).resolve().parents[1] / "app" / "reports" / "machine.py"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# Modules the harness imports that older trees lack, loaded from this tree under their own names:
# the history and its drafter (before issue 30; the history paths are not run on such trees),
# and the generation's settings (engine/generator.py held them before issue 35; the old generator
# reads the same fields).
PROVIDED_MODULES = ("engine.drafters.history_index", "engine.drafters.suffix",
                    "engine.generation_config")


def provide_modules() -> None:
    for name in PROVIDED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            load(ROOT.joinpath(*name.split(".")).with_suffix(".py"), name)


if __name__ == "__main__":
    provide_modules()
    harness = load(HARNESS, "overhead_harness")
    machine = load(MACHINE, "machine_line")
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    # The history paths need an engine that drafts from a history (issue 30); older trees
    # run the rest.
    paths = (sys.argv[3].split(",") if len(sys.argv) > 3
             else [p[0] for p in harness.PATHS if p[0] not in harness.HISTORY_PATHS])
    rows, _ = harness.run_overhead(max_tokens=max_tokens, repeats=repeats, paths=paths)
    print(harness.markdown(rows, harness.QWEN_VOCAB, machine.machine_line()))
