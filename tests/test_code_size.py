"""No module in coordinator/ over MODULE_LINES_MAX lines and no function over
FUNCTION_LINES_MAX, generated code aside (issue: one job per module; a newcomer reads a module
in one sitting). A module that grows past the bound has grown a second job: split it, as
server/service.py, core/state_machine.py and client/_base.py were split."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coordinator"
MODULE_LINES_MAX = 600
FUNCTION_LINES_MAX = 80


def _generated(path: pathlib.Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))


def _sources() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not _generated(p))


def oversized(path: pathlib.Path, source: str) -> list[str]:
    """What in ``source`` (the text of ``path``) breaks a bound, one line each."""
    found = []
    lines = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
    if lines > MODULE_LINES_MAX:
        found.append(f"{path}: {lines} lines (at most {MODULE_LINES_MAX})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES_MAX:
                found.append(f"{path}:{node.lineno}: {node.name} is {length} lines (at most {FUNCTION_LINES_MAX})")
    return found


def test_the_package_has_modules_to_check():
    assert len(_sources()) > 50


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_or_function_over_the_bounds(path):
    assert oversized(path.relative_to(ROOT), path.read_text(encoding="utf-8")) == []


def test_the_check_catches_a_long_module_and_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES_MAX))
    long_function = f"def f():\n{body}\n"
    assert oversized(pathlib.Path("m.py"), long_function) == [
        f"m.py:1: f is {FUNCTION_LINES_MAX + 1} lines (at most {FUNCTION_LINES_MAX})"]
    long_module = "x = 1\n" * (MODULE_LINES_MAX + 1)
    assert oversized(pathlib.Path("m.py"), long_module) == [
        f"m.py: {MODULE_LINES_MAX + 1} lines (at most {MODULE_LINES_MAX})"]
    assert oversized(pathlib.Path("m.py"), "x = 1\n" * MODULE_LINES_MAX) == []
