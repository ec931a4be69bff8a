"""Which ``core.outbox`` rows belong to a correlation id, read from their messages.

The outbox has no correlation column (its rows live seconds), so its query finds the rows
whose message text holds the id (``job_status.sql``, ``outbox_by_correlation``). That text
match alone would also list the jobs of a longer id that starts with it (``order-5`` in
``order-50``), or of a tenant or kind that happens to spell it; this module decodes each
row's message as its broker column says it is stored and keeps the row only when the job's
own correlation id is the one asked.
"""

from __future__ import annotations

import json

__all__ = ["belongs", "spellings"]


def spellings(correlation_id: str) -> dict[str, str]:
    """Query parameters: the id as written, JSON-escaped once and twice."""
    escaped = json.dumps(correlation_id)[1:-1]
    return {
        "correlation_id": correlation_id,
        "escaped": escaped,
        "escaped_twice": json.dumps(escaped)[1:-1],
    }


def belongs(broker: str, message: str | bytes, correlation_id: str) -> bool:
    """Whether the job an outbox row holds has ``correlation_id`` (``False`` for a message
    that cannot be read).

    ``redis``: a wire message, or a delayed entry ``{"q", "m"}`` with the wire message as
    a string; ``amqp``: an encoded AMQP message (Celery's headers in
    ``application_headers``); ``unique``: the request with the envelope as ``payload``.
    A wire message carries the id at the end of its ``argsrepr``
    (``"(job_id=… correlation_id=<id>)"``).
    """
    try:
        data = json.loads(message)
        if broker == "unique":
            return bool(data["payload"]["correlation_id"] == correlation_id)
        if broker == "amqp":
            headers = (data.get("p") or {}).get("application_headers") or {}
        else:
            wire = json.loads(data["m"]) if "m" in data and "headers" not in data else data
            headers = wire.get("headers") or {}
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    argsrepr = headers.get("argsrepr")
    return isinstance(argsrepr, str) and argsrepr.endswith(f" correlation_id={correlation_id})")
