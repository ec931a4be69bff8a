"""The package's layering: each folder imports only the folders below it, and no module
imports itself back through others (function-local imports included).

The layers are the import-linter contract in pyproject.toml (``[tool.importlinter]``);
docs/design.md shows the same tree.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_layers_contract_is_kept() -> None:
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
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
    return found


def test_no_module_imports_itself_back() -> None:
    # function-local imports count: grimp reads every import statement of a module
    graph = grimp.build_graph("platform_tasks", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.c", imported="a.d")
    assert _cycles(graph) == [["a.b", "a.c"]]


def _contract_layers() -> list[set[str]]:
    """The contract's layers, top first, as short names; the contrib modules below the
    app share the name ``contrib`` (``contrib.django`` has a layer of its own)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = config["tool"]["importlinter"]["contracts"]
    layers = []
    for layer in contract["layers"]:
        names = set()
        for module in re.split(r"[|:]", layer):
            name = module.strip().removeprefix("platform_tasks.")
            if name.startswith("contrib.") and name != "contrib.django":
                name = "contrib"
            names.add(name)
        layers.append(names)
    return layers


def _design_layers() -> list[set[str]]:
    """The layer diagram of docs/design.md: the first column of its first code block."""
    design = (ROOT / "docs" / "design.md").read_text()
    block = design.split("```\n", 2)[1]
    rows = [re.split(r"\s{2,}", line.strip())[0] for line in block.splitlines() if line.strip()]
    return [{name.strip() for name in row.split("|")} for row in rows]


def test_the_design_doc_draws_the_contracts_layers() -> None:
    assert _design_layers() == _contract_layers(), (
        "docs/design.md's layer diagram and pyproject.toml's import-linter layers disagree"
    )
