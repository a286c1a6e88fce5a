"""The layers point one way: app -> bench -> loading -> {models, engine}, and models -> engine.errors.

- `engine` (the decoding core) imports nothing of models, loading, bench or app;
- `models` (catalog, store, hub, GGUF headers, budget) imports nothing of loading, bench or app,
  and of the engine only `engine.errors`, the errors every layer raises;
- `loading` (checks, derived drafts, loading a pair) imports nothing of bench or app;
- `bench` (measurement: benchmarks, overhead, the exactness report, tuning, the shared fakes,
  the research drivers) imports nothing of app; app runs it and formats what it returns.
Inside the engine, control (`engine.control`: policies, the controller, its costs and estimator)
imports nothing of the loop it steers (the pair, the generator, a round, the drafters). Inside
the app, the page (`app.ui`) and the API (`app.serve`) share what they need through
`app.runtime` (the defaults users see, the pair holder, the queue) and import nothing of each
other; the runtime imports neither.
Each layer is imported whole, every module of it, in a fresh interpreter, and what it pulled in
is checked. Sources are scanned too: only modules under engine/llama/ import llama_cpp, only
engine/grammar/llg.py imports llguidance, nothing outside tests/ imports `tests`, no file puts
a folder on `sys.path` (a module runs as `python -m`), and the engine, models and loading import
at the top of their files, where a cycle fails at once.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Layer -> the packages it must not pull in, and the only engine modules it may pull in (None:
# any).
RULES = {
    "engine": (("models", "loading", "bench", "app", "tests"), None),
    "models": (("loading", "bench", "app", "tests"), {"engine", "engine.errors"}),
    "loading": (("bench", "app", "tests"), None),
    "bench": (("app", "tests"), None),
}

_IMPORT_ALL = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    pkg = importlib.import_module(sys.argv[1])
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
    print(json.dumps(sorted(sys.modules)))
""")


def imported_by(package: str, root: Path = ROOT) -> set[str]:
    """Every module loaded once all of `package`'s modules are imported in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL, package], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def violations(package: str, forbidden: tuple[str, ...], engine_allowed: set[str] | None,
               root: Path = ROOT) -> list[str]:
    loaded = imported_by(package, root)
    bad = sorted(m for m in loaded if m.split(".")[0] in forbidden)
    if engine_allowed is not None:
        bad += sorted(m for m in loaded if m.split(".")[0] == "engine" and m not in engine_allowed)
    return bad


@pytest.mark.parametrize("layer", sorted(RULES))
def test_each_layer_imports_only_the_layers_below_it(layer):
    forbidden, engine_allowed = RULES[layer]
    assert violations(layer, forbidden, engine_allowed) == []


# App group -> the app groups it must not pull in.
APP_RULES = {
    "app.runtime": ("app.ui", "app.serve"),
    "app.ui": ("app.serve",),
    "app.serve": ("app.ui",),
}


@pytest.mark.parametrize("group", sorted(APP_RULES))
def test_the_page_and_the_api_share_the_runtime_and_not_each_other(group):
    loaded = imported_by(group)
    bad = sorted(m for m in loaded for g in APP_RULES[group] if m == g or m.startswith(g + "."))
    assert bad == []


def test_the_check_sees_a_layer_that_imports_one_above_it(tmp_path):
    # The checker itself can fail: a low package importing a high one, two modules deep.
    (tmp_path / "low" / "sub").mkdir(parents=True)
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "low" / "sub" / "__init__.py").write_text("")
    (tmp_path / "low" / "sub" / "deep.py").write_text("import high.top\n")
    (tmp_path / "high" / "__init__.py").write_text("")
    (tmp_path / "high" / "top.py").write_text("")
    assert violations("low", ("high",), None, tmp_path) == ["high", "high.top"]
    assert violations("high", ("low",), None, tmp_path) == []


# Every folder of Python outside tests/: the product, its measurement and its scripts.
PRODUCT = ("engine", "models", "loading", "bench", "app", "scripts")


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, at module level) for every import in `path`; a module-level `try` or `if`
    (an optional dependency's fallback) still counts as module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[int] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        top.add(id(node))
        if isinstance(node, ast.If):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers
                                                                 for s in h.body]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, node.lineno, id(node) in top))
    return found


def test_only_modules_under_engine_llama_import_llama_cpp():
    # The product and its tools; tests may measure llama.cpp itself.
    users = {str(p.relative_to(ROOT)) for p in sources(*PRODUCT)
             for module, _, _ in imports(p) if module.split(".")[0] == "llama_cpp"}
    assert users and all(u.startswith("engine/llama/") for u in users), users


def test_only_the_grammar_engine_imports_llguidance():
    users = {str(p.relative_to(ROOT)) for p in sources(*PRODUCT)
             for module, _, _ in imports(p) if module.split(".")[0] == "llguidance"}
    assert users == {"engine/grammar/llg.py"}, users


def test_engine_models_and_loading_import_at_the_top_of_their_files():
    inside = [f"{p.relative_to(ROOT)}:{line} {module}"
              for p in sources("engine", "models", "loading")
              for module, line, at_top in imports(p) if not at_top]
    assert inside == []


# Engine group (a folder) -> the engine modules its files must not import.
ENGINE_RULES = {
    "engine/control": ("engine.pair", "engine.generator", "engine.round", "engine.answer",
                       "engine.drafters"),
}


def test_the_core_imports_no_measurement_and_control_not_the_loop_it_steers():
    # Every import, a function's included: the layer check above sees only what a module
    # pulls in when it is imported.
    bad = [f"{p.relative_to(ROOT)}:{line} {module}" for p in sources("engine")
           for module, line, _ in imports(p) if module.split(".")[0] == "bench"]
    for folder, forbidden in ENGINE_RULES.items():
        bad += [f"{p.relative_to(ROOT)}:{line} {module}" for p in sources(folder)
                for module, line, _ in imports(p)
                if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert bad == []


def test_the_scan_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("try:\n    import json\nexcept ImportError:\n    json = None\n\n"
                 "def g():\n    import llama_cpp\n")
    assert imports(f) == [("json", 2, True), ("llama_cpp", 7, False)]


def test_nothing_outside_tests_imports_tests():
    users = [f"{p.relative_to(ROOT)}:{line} {module}" for p in sources(*PRODUCT)
             for module, line, _ in imports(p) if module.split(".")[0] == "tests"]
    assert users == []


def path_inserts(path: Path) -> list[int]:
    """The lines of `path` that change `sys.path` (insert, append, extend, assignment)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value  # sys.path.insert(...)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t for t in targets if isinstance(t, ast.Attribute)), None)
        if (isinstance(target, ast.Attribute) and target.attr == "path"
                and isinstance(target.value, ast.Name) and target.value.id == "sys"):
            found.append(node.lineno)
    return sorted(found)


def test_no_file_puts_a_folder_on_sys_path():
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sources(*PRODUCT, "tests")
           for line in path_inserts(p)]
    assert bad == []


def test_the_scans_see_a_tests_import_and_a_sys_path_insert(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import sys\nfrom tests.fakes import X\nsys.path.insert(0, 'x')\n"
                 "sys.path += ['y']\nprint(sys.path)\n")
    assert [m for m, _, _ in imports(f)] == ["sys", "tests.fakes"]
    assert path_inserts(f) == [3, 4]
