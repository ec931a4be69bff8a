"""Print the import circles of ``platform_tasks``, counting type-only imports.

The layers test (tests/unit/test_import_layers.py) leaves out imports under
``if TYPE_CHECKING:``, because they never run. They still tie modules together for a
reader and for the type checker: a module that imports the composition root ``app.py``
only for a type sits in one circle with everything the root installs. This script counts
them, so the circle through a module can be measured before and after a change:

    python scripts/import_cycles.py                      # every circle, largest first
    python scripts/import_cycles.py platform_tasks.app   # the circle through app.py
    python scripts/import_cycles.py --runtime ...        # runtime imports only

It prints one line per circle (size, then its modules) and, for a module named on the
command line, how many modules import it directly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    imported = graph.find_modules_directly_imported_by(child)
                    work.append((child, iter(sorted(imported))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found, key=len, reverse=True)


def main(argv: list[str]) -> int:
    runtime_only = "--runtime" in argv
    modules = [arg for arg in argv if not arg.startswith("--")]
    graph = grimp.build_graph("platform_tasks", exclude_type_checking_imports=runtime_only)
    found = circles(graph)
    kind = "runtime imports" if runtime_only else "imports, type-only included"
    if not modules:
        print(f"{len(found)} circle(s) ({kind})")
        for circle in found:
            print(f"{len(circle)}: {' '.join(circle)}")
        return 0
    for module in modules:
        importers = graph.find_modules_that_directly_import(module)
        through = next((c for c in found if module in c), [])
        print(f"{module}: imported directly by {len(importers)} module(s) ({kind})")
        print(f"circle through {module}: {len(through)} module(s)")
        for member in through:
            print(f"  {member}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
