"""docs/design.md's module map is the package's tree (``scripts/module_map.py --write``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _module_map() -> object:
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "scripts" / "module_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_design_doc_shows_the_current_tree() -> None:
    module_map = _module_map()
    design = (ROOT / "docs" / "design.md").read_text()
    assert module_map.design_block(design) == module_map.module_map(), (  # type: ignore[attr-defined]
        "docs/design.md's module map is stale: run python scripts/module_map.py --write"
    )
