"""One way to open a pair (app/runtime/open_pair.py): every command that loads (`generate`,
`serve`, `ui`, `bench`, `exactness`, `calibrate`, `tune`, and the page's ceiling) goes through
`open_pair`, which applies the pairing record by the command's rule or says it is not used;
nothing else in app/ plans, executes or keeps evidence itself; the page imports no CLI module,
and app/runtime/ takes no argparse objects.

The commands run for real over tiny GGUF headers up to the load, where the one function's
`execute` is replaced by one that raises `Opened`; llama.cpp's loader raises `Bypassed`, so a
command that loaded any other way would end in that instead (the negative control does).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app import cli, ui_cli
from app.runtime import open_pair as opening
from app.runtime.open_pair import PairRequest, open_pair, print_plan
from app.runtime.tuned import PAGE, PairingRule, key_for
from engine.backend import ModelConfig
from engine.errors import SettingsError
from engine.llama import backend as llama
from loading.options import LoadOptions
from models.machine import Machine
from models.candidate import Candidate
from models.tuned import Choice, PairingRecord, save
from tests import tinygguf
from bench.fakes.backend import FakeBackend

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
CPU_ONLY = Machine(64 * GIB, 60 * GIB)


class Opened(Exception):
    """Raised where open_pair would execute its plan: the command went through it."""

    def __init__(self, plan) -> None:
        super().__init__("opened through open_pair")
        self.plan = plan


class Bypassed(Exception):
    """Raised by llama.cpp's loader: something loaded a model without open_pair."""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Tiny target and draft files with a pairing record that chooses prompt lookup (no draft
    model), a CPU-only machine, and the two tripwires; returns (target, draft, plans opened)."""
    for env, sub in (("TANDEM_HOME", "home"), ("TANDEM_MODELS", "store"),
                     ("TANDEM_HISTORY", "history"), ("TANDEM_PAIRS", "pairs")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    target = tinygguf.write(tmp_path / "target.gguf", n_layer=4)
    draft = tinygguf.write(tmp_path / "draft.gguf", n_layer=2)
    chosen = Choice(Candidate("lookup", draft_quant="off", policy="fixed", gamma=3), acceptance=0.5,
                    speedup_median=1.2, speedup_p10=1.0, n_prompts=4)
    save(PairingRecord(key=key_for(target, draft), target=str(target), draft=str(draft),
                       adapter="", adapter_scale=1.0, chosen=chosen, measured={}))
    monkeypatch.setattr("loading.devices.detect", lambda: CPU_ONLY)
    plans: list = []

    def spy(plan, **kwargs):
        plans.append(plan)
        raise Opened(plan)

    def bypassed(config):
        raise Bypassed(config.path)

    monkeypatch.setattr(opening, "execute", spy)
    monkeypatch.setattr(llama, "load", bypassed)
    return str(target), str(draft), plans


MODELS = ("--ctx", "256")
# Command -> its arguments after the files, and what it says of the pairing record.
COMMANDS = {
    "generate": (["--prompt", "hi", "--max-tokens", "4"], "using tuned pairing"),
    "serve": ([], "using tuned pairing"),
    "bench": (["--quick"], "pairing record: not used (bench compares drafters itself)"),
    "exactness": (["--quick"],
                  "pairing record: not used (exactness checks the drafter it is given)"),
    "calibrate": ([], "pairing record: not used (calibrate measures the pair as given)"),
    "tune": (["--budget-minutes", "1"],
             "pairing record: not used (tune measures the candidates itself)"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_loading_command_opens_its_pair_through_the_one_function(world, command, capsys,
                                                                      tmp_path):
    target, draft, plans = world
    extra, said = COMMANDS[command]
    out = ["--out", str(tmp_path / "out")] if command in ("bench", "exactness") else []
    with pytest.raises(Opened):
        cli.main([command, "--target", target, "--draft", draft, *MODELS, *extra, *out])
    assert len(plans) == 1
    err = capsys.readouterr().err
    assert said in err, err
    # Applied, the record's prompt lookup needs no draft model; not used, the draft is loaded.
    applied = said == "using tuned pairing"
    assert (plans[0].draft is None) == applied
    assert err.index(said) < err.index("offload: ")


def test_the_app_opens_its_pair_through_the_one_function(world, monkeypatch, capsys):
    target, draft, plans = world
    ended = []

    def serve_app(holder, access, api, start=None):
        ended.append(holder.wait(60))
        return 0
    monkeypatch.setattr(ui_cli, "serve_app", serve_app)
    assert cli.main(["ui", "--target", target, "--draft", draft, *MODELS]) == 0
    assert len(plans) == 1 and "Opened" in ended[0].message
    # The page keeps the draft for its other drafters, and prints the plan.
    assert plans[0].draft is not None and "offload: " in capsys.readouterr().err


def test_the_pages_ceiling_opens_its_pair_through_the_one_function(world):
    from app.ui.wizard import measure_ceiling
    target, draft, plans = world
    with pytest.raises(Opened):
        measure_ceiling("", target, "", draft, 256)
    assert len(plans) == 1 and plans[0].draft is not None


def test_a_load_around_the_one_function_is_caught(world):
    """The negative control: loading as `bench` did before (loading.load.load_pair) trips the
    other wire, and the one function saw nothing."""
    from loading.load import load_pair
    target, draft, plans = world
    with pytest.raises(Bypassed):
        load_pair(ModelConfig(target, n_ctx=256), ModelConfig(draft, n_ctx=256),
                  LoadOptions(draft_quant="off"), announce=print_plan)
    assert plans == []


# The one function's own sequence, with fake models -------------------------------------------

@pytest.fixture
def files(tmp_path, monkeypatch):
    for env, sub in (("TANDEM_HOME", "home"), ("TANDEM_MODELS", "store"),
                     ("TANDEM_HISTORY", "history"), ("TANDEM_PAIRS", "pairs")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    monkeypatch.setattr("loading.devices.detect", lambda: CPU_ONLY)
    vocab = tinygguf.vocab(64)
    return (ModelConfig(str(tinygguf.write(tmp_path / "t.gguf", tokens=vocab)), n_ctx=256),
            ModelConfig(str(tinygguf.write(tmp_path / "d.gguf", tokens=vocab)), n_ctx=256))


def kept(monkeypatch) -> list:
    keys: list = []
    monkeypatch.setattr(opening, "keep_evidence", lambda pair, key: keys.append(key))
    return keys


def test_a_load_that_uses_the_record_keeps_evidence_and_history(files, monkeypatch):
    keys = kept(monkeypatch)
    opened = open_pair(PairRequest(*files, LoadOptions(draft_quant="off"), history_tokens=64),
                       loader=lambda c: FakeBackend(eog=59))
    try:
        assert keys == [key_for(files[0].path, files[1].path)]
        assert opened.history is not None and opened.pairing.key == keys[0]
        assert opened.plan.draft is not None and opened.pair.draft_backend is not None
    finally:
        opened.pair.close()


def test_an_ignored_record_is_not_looked_up_and_said(files, monkeypatch, capsys):
    keys = kept(monkeypatch)
    opened = open_pair(PairRequest(*files, LoadOptions(draft_quant="off"),
                                   PairingRule.ignored("a test measures itself")),
                       loader=lambda c: FakeBackend(eog=59))
    opened.pair.close()
    assert keys == [] and opened.pairing.key is None and opened.history is None
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "pairing record: not used (a test measures itself)"
    assert err[1].startswith("offload: ")


def test_the_page_rule_prints_nothing(files, monkeypatch, capsys):
    kept(monkeypatch)
    opened = open_pair(PairRequest(*files, LoadOptions(draft_quant="off"), PairingRule(PAGE),
                                   say=opening.QUIET), loader=lambda c: FakeBackend(eog=59))
    opened.pair.close()
    assert capsys.readouterr() == ("", "")


def test_a_step_that_fails_after_the_load_closes_the_models(files, monkeypatch):
    kept(monkeypatch)
    closed: list[str] = []

    class Tracked(FakeBackend):
        def close(self) -> None:
            closed.append("closed")
            super().close()
    # A history of fewer than 16 tokens is refused once the target's vocabulary is known.
    with pytest.raises(SettingsError, match="history size"):
        open_pair(PairRequest(*files, LoadOptions(draft_quant="off"), history_tokens=1),
                  loader=lambda c: Tracked(eog=59))
    assert closed == ["closed", "closed"]


# Sources and imports -------------------------------------------------------------------------

LOAD_STEPS = {"plan_load", "execute", "load_pair", "keep_evidence", "keep_calibrations"}
OPENER = ROOT / "app" / "runtime" / "open_pair.py"


def load_steps(source: str) -> set[str]:
    """The load steps `source` imports from the loading layer, by name or by module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loading"):
            for alias in node.names:
                if alias.name in LOAD_STEPS:
                    found.add(alias.name)
                elif f"{node.module}.{alias.name}" in ("loading.load", "loading.plan",
                                                      "loading.evidence"):
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names
                      if a.name in ("loading.load", "loading.plan", "loading.evidence")}
    return found


def test_no_app_module_but_the_one_plans_executes_or_keeps_evidence():
    found = {str(p.relative_to(ROOT)): load_steps(p.read_text(encoding="utf-8"))
             for p in (ROOT / "app").rglob("*.py") if p != OPENER}
    assert {p: s for p, s in found.items() if s} == {}
    # The scan sees the steps where they are, and where a module would import them anew.
    assert load_steps(OPENER.read_text(encoding="utf-8")) == {"plan_load", "execute",
                                                               "keep_evidence",
                                                               "keep_calibrations"}
    assert load_steps("from loading.load import load_pair\nfrom loading import plan") == {
        "load_pair", "loading.plan"}


def argparse_uses(source: str) -> list[str]:
    """Where `source` imports argparse or names one of its objects."""
    tree = ast.parse(source)
    uses = [f"line {n.lineno}" for n in ast.walk(tree)
            if isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names)
            or isinstance(n, ast.ImportFrom) and n.module == "argparse"]
    uses += [f"line {n.lineno}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "argparse"]
    uses += [f"line {n.lineno}" for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and re.fullmatch(r"argparse\.\w+", n.value)]
    return uses


def test_the_runtime_takes_no_argparse_objects():
    found = {str(p.relative_to(ROOT)): argparse_uses(p.read_text(encoding="utf-8"))
             for p in (ROOT / "app" / "runtime").rglob("*.py")}
    assert {p: u for p, u in found.items() if u} == {}
    assert argparse_uses("import argparse\ndef f(args: argparse.Namespace): pass") == [
        "line 1", "line 2"]
    assert argparse_uses("def f(args: 'argparse.Namespace'): pass") == ["line 1"]


_IMPORTED = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    pkg = importlib.import_module(sys.argv[1])
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
    print(json.dumps(sorted(sys.modules)))
""")

# The command line's modules: the parsers and their options (app/settings.py).
CLI_MODULE = re.compile(r"app\.(\w+_cli|cli|settings)")


def cli_modules(modules) -> list[str]:
    return sorted(m for m in modules if CLI_MODULE.fullmatch(m))


def test_the_page_imports_no_command_line_module():
    done = subprocess.run([sys.executable, "-c", _IMPORTED, "app.ui"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert {"app.ui.wizard", "app.runtime.ceiling_advice", "app.runtime.open_pair"} <= loaded
    assert cli_modules(loaded) == []
    assert cli_modules({"app.calibrate_cli", "app.cli", "app.settings", "app.runtime.tuned"}) == [
        "app.calibrate_cli", "app.cli", "app.settings"]
