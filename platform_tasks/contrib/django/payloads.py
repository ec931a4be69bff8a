"""How a dead letter's payload is shown: its ``data`` only to users allowed to see it,
and always as escaped text."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html  # type: ignore[import-untyped]

__all__ = ["HIDDEN", "payload_html", "visible_payload"]

PRIVATE_KEYS = frozenset({"data", "raw"})
HIDDEN = "(hidden: needs the permission platform_console.view_dead_letter_payload)"


def visible_payload(payload: Any, *, show_data: bool) -> Any:
    """The payload as a user may see it: without the permission, the envelope's ``data``
    (the customer's data) and a poison message's ``raw`` body are replaced by a note, and
    a payload that is not a JSON object is hidden whole (what in it is data cannot be told)."""
    if show_data:
        return payload
    if isinstance(payload, dict):
        return {key: (HIDDEN if key in PRIVATE_KEYS else value) for key, value in payload.items()}
    return HIDDEN


def payload_html(payload: Any, *, show_data: bool) -> str:
    text = json.dumps(
        visible_payload(payload, show_data=show_data),
        indent=2,
        ensure_ascii=False,
        sort_keys=True,
        default=str,
    )
    return str(format_html('<pre class="platform-payload">{}</pre>', text))
