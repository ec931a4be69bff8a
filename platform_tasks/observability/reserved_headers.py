"""Header names a publisher's custom headers may not take: Celery's and the platform's own.

Celery builds a message's headers from its protocol fields (``id``, ``task``, ``eta``,
``expires``, ``retries``, ``timelimit``, …) and then merges the ``headers`` of a publish
over them, so a custom ``id`` replaces the job's id on the wire and a custom ``eta`` its
due time. On the worker every header becomes an attribute of the task request, beside the
attributes Celery sets from the delivery (``hostname``, ``reply_to``, ``delivery_info``,
…), so a custom header with such a name is read back as Celery's value, not the
publisher's. The platform sets a few headers of its own on every message (the attempt,
the tenant, the carried names, the ready time) that a custom one would fight with.

These names are refused at publish with an error naming the header, not moved under a
prefix: a renamed header would silently not be where the application reads it, while a
refusal says at once which name to change, and every other name travels unchanged.
Carried header sets (retries, throttles, dead letters) and replays drop them, for
messages and dead letters written before the refusal.
"""

from __future__ import annotations

from celery.app.task import Context

from platform_tasks.headers import (
    ATTEMPT_HEADER,
    CARRIED_HEADER,
    PLATFORM_HEADERS,
    PUBLISHED_AT_HEADER,
)

__all__ = [
    "ATTEMPT_HEADER",
    "CARRIED_HEADER",
    "CELERY_HEADERS",
    "PLATFORM_HEADERS",
    "PUBLISHED_AT_HEADER",
    "reserved_header",
    "without_reserved",
]


_PROTOCOL = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    }
)
"""Celery's message protocol 2 headers (``celery.app.amqp.AMQP.as_task_v2``)."""

_REQUEST = frozenset({"properties", "reply_to", "correlation_id", "hostname", "delivery_info"})
"""What the worker adds to a request from the delivery (``celery.worker.request.Request``)."""

CELERY_HEADERS = (
    _PROTOCOL | _REQUEST | frozenset(name for name in vars(Context) if not name.startswith("__"))
)
"""Every name a header cannot take without replacing or reading back Celery's own: its
protocol headers and each attribute of its task request (``Context``, read from the
installed Celery, so a later version's new attributes are covered too)."""


def reserved_header(name: str) -> str | None:
    """Why ``name`` may not be a custom header, or ``None`` when it may."""
    if name in PLATFORM_HEADERS:
        return "the platform sets it on every message"
    if name in _PROTOCOL:
        return "one of Celery's protocol headers, which a custom header would replace"
    if name in CELERY_HEADERS:
        return "an attribute of Celery's task request, read back as Celery's value"
    return None


def without_reserved(headers: dict[str, object]) -> dict[str, object]:
    """``headers`` without the reserved names (a stored or carried set, written before
    they were refused)."""
    return {name: value for name, value in headers.items() if reserved_header(name) is None}
