"""``fan_out(ctx, …)``: the call a scheduled job's handler makes to fan out per tenant.

A scheduled job's trigger is deliberately unreliable (no retries, no catch-up), so the
handler does not publish the tenants' work itself: it hands one fan-out job to the queue
port, whose consumer (:mod:`.consumer`) does. The fan-out job's id is derived from (job
name, point, kind), so a trigger delivered twice hands over the same job twice and the
consumer's idempotency row lets only one of them publish.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from platform_tasks.errors import ConfigurationError
from platform_tasks.fanout.ids import fan_out_job_id
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FANOUT_TENANT

__all__ = ["bind_port", "bound_port", "fan_out"]

logger = logging.getLogger("platform_tasks.fanout")

_BINDING: dict[str, Any] = {}


def bind_port(port: Any) -> None:
    """Make ``port`` the queue port ``fan_out`` publishes with (see ``install``)."""
    _BINDING["port"] = port


def bound_port() -> Any:
    port = _BINDING.get("port")
    if port is None:
        raise ConfigurationError(
            "fan_out() has no queue port: call platform_tasks.fanout.install(app, queue_port) "
            "in the composition root (celery_app.py)"
        )
    return port


def fan_out(
    ctx: Any,
    *,
    queue: str,
    kind: str,
    data: Mapping[str, Any] | None = None,
    tiers: Literal["due"] | None = None,
    port: Any = None,
) -> uuid.UUID:
    """Hand the fan-out of this point to the reliable queue; return the fan-out job id.

    Its consumer publishes one envelope per tenant on ``queue`` with ``kind``, a shared
    correlation id, ``data`` plus ``data["scheduled_for"]`` (the point, ISO UTC) and a job
    id derived from (job name, point, kind, tenant). ``tiers="due"`` keeps only tenants
    whose freshness tier is due in the point's UTC hour. ``port`` overrides the queue port
    bound by ``install``.
    """
    if tiers not in (None, "due"):
        raise ValueError(f"fan_out: tiers must be None or 'due', got {tiers!r}")
    if not isinstance(queue, str) or not queue:
        raise ValueError("fan_out: queue must be a non-empty queue name")
    if data is not None and not isinstance(data, Mapping):
        raise TypeError(f"fan_out: data must be a mapping, got {type(data).__name__}")
    if data is not None and "scheduled_for" in data:
        raise ValueError("fan_out: data['scheduled_for'] is set by the fan-out (the point)")
    publisher = port if port is not None else bound_port()
    job_id = fan_out_job_id(ctx.name, ctx.scheduled_for, kind)
    request = {
        "job": ctx.name,
        "point": ctx.scheduled_for.isoformat(),
        "queue": queue,
        "kind": kind,
        "data": dict(data or {}),
        "tiers": tiers,
    }
    publisher.publish(FANOUT_QUEUE, {
        "job_id": str(job_id),
        "tenant_id": FANOUT_TENANT,
        "correlation_id": f"fanout-{job_id}",
        "kind": FANOUT_KIND,
        "data": request,
    })  # fmt: skip
    logger.info(
        "fan-out %s of %s at %s to %s handed to %s", job_id, ctx.name,
        ctx.scheduled_for.isoformat(), kind, FANOUT_QUEUE,
        extra={"event": "fanout.requested", "fanout_job_id": str(job_id), "job": ctx.name,
               "point": ctx.scheduled_for.isoformat(), "kind": kind, "queue": queue,
               "tiers": tiers},
    )  # fmt: skip
    return job_id
