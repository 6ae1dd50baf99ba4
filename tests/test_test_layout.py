"""The suite's own layout: helpers shared between test files live in tests/helpers.py, and no
test file imports from another (a test file changes for its own tests only)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (a lazy import inside a test counts too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_test_file_imports_from_another_test_file():
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 20, files  # the glob found the suite
    test_modules = {f"tests.{f.stem}" for f in files}
    crossing = {
        f.name: sorted(test_modules & _imported_modules(f) - {f"tests.{f.stem}"}) for f in files
    }
    assert not {name: found for name, found in crossing.items() if found}, (
        "move what test files share into tests/helpers.py"
    )
