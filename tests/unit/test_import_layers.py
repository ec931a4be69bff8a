"""The package's layering: each folder imports only the folders below it, and no module
imports itself back through others (function-local imports included).

The layers are the import-linter contract in pyproject.toml (``[tool.importlinter]``);
docs/design.md shows the same tree.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_layers_contract_is_kept() -> None:
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def _import_cycles() -> Any:
    spec = importlib.util.spec_from_file_location(
        "import_cycles", ROOT / "scripts" / "import_cycles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (scripts/import_cycles.py)."""
    found: list[list[str]] = _import_cycles().circles(graph)
    return found


def test_no_module_imports_itself_back() -> None:
    # function-local imports count: grimp reads every import statement of a module
    graph = grimp.build_graph("platform_tasks", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_no_type_only_import_ties_a_module_to_the_composition_root() -> None:
    """Counting imports under ``if TYPE_CHECKING:`` too, no circle runs through ``app.py``
    (the stages import the app's type from ``kernel.py``) or through the kernel."""
    graph = grimp.build_graph("platform_tasks", exclude_type_checking_imports=False)
    tied = [c for c in _cycles(graph) if {"platform_tasks.app", "platform_tasks.kernel"} & set(c)]
    assert tied == []


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
