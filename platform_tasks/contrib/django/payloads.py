"""What a dead letter shows a user without ``view_dead_letter_payload``: the envelope's
metadata, never what may be customer data, and always as escaped text.

Customer data is not only the envelope's ``data``: a message that was not an envelope
(Celery's ``{"args": [...], "kwargs": {...}}``, a poison body under ``raw``, anything a
foreign producer sent) can carry it under any key, and a key's name can be data too. So
the rule is an allow-list: the envelope's identifying fields (and a poison record's
encoding and content type) are shown when they are plain values; every other key is
hidden, and so is a payload that is not a JSON object. The error text is hidden by the
same permission (:func:`error_html`): a database error quotes the value it refused.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html

from platform_tasks.contrib.django.apps import APP_LABEL
from platform_tasks.contrib.django.permissions import VIEW_PAYLOAD

__all__ = ["HIDDEN", "METADATA_KEYS", "error_html", "payload_html", "visible_payload"]

HIDDEN = f"(hidden: needs the permission {APP_LABEL}.{VIEW_PAYLOAD})"
METADATA_KEYS = frozenset(
    {"job_id", "tenant_id", "correlation_id", "kind", "raw_encoding", "content_type"}
)
"""Keys shown to everyone: what identifies a job, never what it carries."""
NAMED_PRIVATE_KEYS = frozenset({"data", "raw", "headers", "args", "kwargs"})
"""Keys whose name is shown with the value hidden (the platform's and Celery's own)."""
OTHER_KEYS = "(other keys)"
_PLAIN = (str, int, float, bool, type(None))


def visible_payload(payload: Any, *, show_data: bool) -> Any:
    """The payload as a user may see it (see the module's docstring for the rule)."""
    if show_data:
        return payload
    if not isinstance(payload, dict):
        return HIDDEN
    shown: dict[str, Any] = {}
    others = 0
    for key, value in payload.items():
        if key in METADATA_KEYS and isinstance(value, _PLAIN):
            shown[key] = value
        elif key in METADATA_KEYS or key in NAMED_PRIVATE_KEYS:
            shown[key] = HIDDEN
        else:
            others += 1
    if others:
        shown[OTHER_KEYS] = f"{others} more key{'s' if others > 1 else ''} {HIDDEN}"
    return shown


def payload_html(payload: Any, *, show_data: bool) -> str:
    text = json.dumps(
        visible_payload(payload, show_data=show_data),
        indent=2,
        ensure_ascii=False,
        sort_keys=True,
        default=str,
    )
    return str(format_html('<pre class="platform-payload">{}</pre>', text))


def error_html(last_error: str | None, *, show_error: bool) -> str:
    """The full error, escaped; without the permission a note (the error type is shown
    beside it, from its own column)."""
    if not show_error:
        return str(format_html('<span class="platform-error-hidden">{}</span>', HIDDEN))
    return str(format_html('<pre class="platform-error">{}</pre>', last_error or ""))
