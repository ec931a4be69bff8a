"""The JSON writer is byte-for-byte ``json.dumps(..., indent=2, ensure_ascii=False)``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_tasks.jobdocs.render_json import _write

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


def _render(value: Any) -> str:
    out: list[str] = []
    _write(value, "\n", out)
    return "".join(out)


@given(JSON_VALUES)
def test_writer_matches_the_standard_library(value: Any) -> None:
    assert _render(value) == json.dumps(value, indent=2, ensure_ascii=False)


def test_writer_refuses_what_json_would_not_write_the_same_way() -> None:
    with pytest.raises(TypeError):
        _render({1: "non-string key"})
    with pytest.raises(TypeError):
        _render({"x": object()})
