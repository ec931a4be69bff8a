"""Stored text made safe for the operator's terminal: no escape sequences, no controls.

Dead letters hold producer data (tenant, kind, queue, error text, payload). Printed as it
is, ``\\x1b]0;…\\x07`` retitles the operator's terminal, ``\\x1b[2J`` clears it, and other
sequences can move the cursor over what was printed or, on some terminals, answer back
into the shell. :func:`printable` removes whole sequences (CSI, OSC, DCS and the other
string controls, in their 7-bit ``ESC`` and 8-bit C1 forms, up to their terminator), then
every C0 and C1 control character and DEL that is left; tab and newline are kept where
the text is shown on lines of its own. JSON output needs none of this: ``json.dumps``
writes every control character as a ``\\u`` escape.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["printable", "printable_json"]

_SEQUENCE = re.compile(
    r"""
      (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]                  # CSI ... final byte
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])           # OSC, DCS, SOS, PM, APC ...
      .*?(?:\x07|\x1b\\|\x9c|\Z)                        # ... up to BEL or ST (or the end)
    | \x1b[ -/]*[0-~]                                   # any other ESC sequence
    """,
    re.VERBOSE | re.DOTALL,
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, C1 controls."""
_LINE_BREAKS = re.compile(r"[\t\n]")


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` without terminal escape sequences or control characters.

    ``multiline``: keep newlines and tabs (an error's traceback); otherwise they become
    spaces (a table cell).
    """
    cleaned = _CONTROL.sub("", _SEQUENCE.sub("", text))
    return cleaned if multiline else _LINE_BREAKS.sub(" ", cleaned)


def printable_json(value: Any) -> Any:
    """``value`` with :func:`printable` applied to every string in it, keys included
    (newlines kept: JSON shows them as ``\\n``)."""
    if isinstance(value, str):
        return printable(value, multiline=True)
    if isinstance(value, dict):
        return {printable_json(key): printable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [printable_json(item) for item in value]
    return value
