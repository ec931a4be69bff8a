"""Size figures of the package, for the refactoring goals in CHANGELOG and design notes.

Prints the largest module, the longest function, the functions of 60 lines or more and
the number of ``type: ignore`` comments under ``platform_tasks/`` (or the folder given).
Run: ``python scripts/code_metrics.py [path]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method in ``tree``."""
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def main(root: Path) -> None:
    modules: list[tuple[int, str]] = []
    funcs: list[tuple[int, str]] = []
    ignores = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(root.parent))
        modules.append((len(text.splitlines()), rel))
        ignores += text.count("type: ignore")
        for name, lines in functions(ast.parse(text)):
            funcs.append((lines, f"{rel}::{name}"))
    modules.sort(reverse=True)
    funcs.sort(reverse=True)
    long_ones = [f for f in funcs if f[0] >= 60]
    print(f"modules: {len(modules)}; largest: {modules[0][1]} ({modules[0][0]} lines)")
    print(f"longest function: {funcs[0][1]} ({funcs[0][0]} lines)")
    print(f"functions of 60+ lines: {len(long_ones)}")
    for lines, name in long_ones:
        print(f"  {lines:4d}  {name}")
    print(f"type: ignore comments: {ignores}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "platform_tasks").resolve())
