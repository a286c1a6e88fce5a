"""No function in app/ is longer than 60 lines: the front ends are short translations into the
request spec (app/runtime/request.py) and short functions over it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function or method longer than `limit`, decorators included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_in_app_is_longer_than_60_lines():
    long = [f"{path.relative_to(ROOT)}: {name} is {lines} lines"
            for path in sorted((ROOT / "app").rglob("*.py"))
            for name, lines in long_functions(path.read_text(encoding="utf-8"))]
    assert not long, "\n".join(long)


def test_the_count_sees_a_long_function_and_its_nested_ones():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f"def short():\n{body}") == []
    assert long_functions(f"@decorated\ndef long():\n{body}") == [("long", 61)]
    nested = "def outer():\n    def inner():\n" + "".join(f"        x{i} = {i}\n" for i in range(60))
    assert [name for name, _ in long_functions(nested)] == ["outer", "inner"]
