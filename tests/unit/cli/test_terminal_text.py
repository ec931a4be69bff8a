"""Stored text made safe for a terminal: whole sequences and control characters go."""

from __future__ import annotations

import pytest

from platform_tasks.cli.terminal_text import printable, printable_json


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b]0;pwned\x07b", "ab"),  # OSC ended by BEL
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC ended by ST
        ("a\x1b[2Jb\x1b[1;31mc\x1b[0m", "abc"),  # CSI
        ("a\x9b31mb\x9d0;t\x9cc", "abc"),  # C1 CSI and OSC
        ("a\x1bPq#0\x1b\\b", "ab"),  # DCS (sixel)
        ("a\x1b]0;never ended", "a"),  # unterminated OSC: the rest would be swallowed anyway
        ("a\x1b7b\x1bc", "ab"),  # other ESC sequences (save cursor, reset)
        ("a\x1b", "a"),  # a lone ESC
        ("a\rb\x08c\x7fd\x00e\x85f", "abcdef"),  # CR, BS, DEL, NUL, NEL
        ("Zürich ✓ 東京", "Zürich ✓ 東京"),  # printable text is kept as it is
    ],
)
def test_sequences_and_controls_are_removed(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_newlines_and_tabs_are_kept_only_in_multiline_text() -> None:
    assert printable("a\nb\tc") == "a b c"
    assert printable("a\nb\tc\x1b[2J", multiline=True) == "a\nb\tc"


def test_every_string_of_a_json_value_is_cleaned() -> None:
    value = {"k\x1b[2J": ["v\x07", {"n": 1, "s": "x\x9b1my"}], "t": ("a\nb",)}
    assert printable_json(value) == {"k": ["v", {"n": 1, "s": "xy"}], "t": ["a\nb"]}
