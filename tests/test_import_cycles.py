"""No import circle inside a package: the modules of `engine/` (and of models, loading, bench and
app) and the modules of the same package each imports form a graph without cycles. Every import
statement counts, wherever it is written: at
the top, inside a function, or under `if TYPE_CHECKING:` (a circle a type checker alone follows
is still two modules that cannot be read one without the other).

Sources are read, not run. The negative controls put back the circle there was between the cost
model and the evidence (engine/control/costs.py imported `Evidence` for its type only) into a
copy of the engine, and one through a function-level import, and the check finds each.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def engine_imports(root: Path = ROOT, package: str = "engine") -> dict[str, set[str]]:
    """Each module of `package` under `root` -> the modules of `package` it imports."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([base] if base else []))
                # `from engine.x import y` imports engine.x.y when y is a module of its own.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_engine_has_no_import_circle():
    graph = engine_imports()
    assert "engine.control.costs" in graph and "engine.control.evidence" in graph
    assert "engine.control.costs" in graph["engine.control.evidence"]
    assert cycles(graph) == []


def _engine_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "engine", tmp_path / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_check_finds_the_circle_a_type_only_import_made(tmp_path):
    root = _engine_copy(tmp_path)
    costs = root / "engine" / "control" / "costs.py"
    costs.write_text(costs.read_text() + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                     "    from engine.control.evidence import Evidence\n")
    assert cycles(engine_imports(root)) == [["engine.control.costs", "engine.control.evidence"]]


def test_the_check_finds_a_circle_through_a_function_and_a_relative_import(tmp_path):
    root = _engine_copy(tmp_path)
    widths = root / "engine" / "widths.py"
    widths.write_text(widths.read_text() + "\n\ndef _late():\n    from .control import costs\n"
                      "    return costs\n")
    found = cycles(engine_imports(root))
    assert len(found) == 1 and {"engine.widths", "engine.control.costs"} <= set(found[0])


def test_no_package_has_an_import_circle():
    # The same check over every package of the product and its measurement; across packages the
    # layers (tests/test_layers.py) already point one way.
    for package in ("models", "loading", "bench", "app"):
        graph = engine_imports(ROOT, package)
        assert len(graph) > 3 and cycles(graph) == [], package
