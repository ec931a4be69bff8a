"""``fan_out(ctx, …)``: the call a scheduled job's handler makes to fan out per tenant.

A scheduled job's trigger is deliberately unreliable (no retries, no catch-up), so the
handler does not publish the tenants' work itself: it hands one fan-out job to the queue
port, whose consumer (:mod:`.consumer`) does. The fan-out job's id is derived from (job
name, point, kind), so a trigger delivered twice hands over the same job twice and the
consumer's idempotency row lets only one of them publish.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from celery._state import get_current_app, get_current_task

from platform_tasks.app_state import AppState
from platform_tasks.errors import ConfigurationError
from platform_tasks.fanout.ids import fan_out_job_id
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FANOUT_TENANT

if TYPE_CHECKING:
    from celery import Celery

    from platform_tasks.kernel import PlatformCelery

__all__ = ["FanOutBinding", "bind", "bound_port", "fan_out"]

logger = logging.getLogger("platform_tasks.fanout")


class FanOutBinding:
    """The queue port ``fan_out`` publishes with for one app.

    ``create_app`` binds every app to its own
    :class:`~platform_tasks.publishing.queue_port.QueuePort`,
    created on first use in each process (a port made before a prefork worker forks is
    not shared with its children). ``install(app, port)`` binds another port instead.
    """

    def __init__(self, app: PlatformCelery, port: Any = None) -> None:
        self.app = app
        self.port = port
        self._own: Any = None
        self._own_pid: int | None = None
        self._lock = threading.Lock()

    def resolve(self) -> Any:
        if self.port is not None:
            return self.port
        with self._lock:
            if self._own is None or self._own_pid != os.getpid():
                from platform_tasks.publishing.queue_port import QueuePort

                self._own = QueuePort(self.app)
                self._own_pid = os.getpid()
            return self._own

    def close(self) -> None:
        """Close the app's own port if this process made it (a given port is the caller's)."""
        with self._lock:
            own, self._own = self._own, None
            if own is not None and self._own_pid == os.getpid():
                own.close()


_BINDING: AppState[FanOutBinding] = AppState("platform_fanout_binding")


def bind(app: PlatformCelery, port: Any = None) -> None:
    """Make ``port`` (default: the app's own queue port) the one ``fan_out`` uses for ``app``."""
    previous = _BINDING.get(app)
    if previous is not None:
        previous.close()
    _BINDING.set(app, FanOutBinding(app, port))


def _running_app() -> Celery:
    """The app of the task running in this thread (a job's trigger), else the current app."""
    task = get_current_task()
    app = getattr(task, "app", None) if task is not None else None
    return app if app is not None else get_current_app()


def bound_port(app: Celery | None = None) -> Any:
    """The queue port ``fan_out`` uses for ``app`` (default: the running app, which may be
    a plain ``Celery()`` app: it has no port unless one was bound)."""
    app = app if app is not None else _running_app()
    binding = _BINDING.get(app)
    if binding is None and getattr(app, "platform_settings", None) is not None:
        raise ConfigurationError(
            f"fan_out() has no queue port: the Celery app {getattr(app, 'main', None)!r} has "
            "no PLATFORM_DATABASE_URL, which the fan-out consumer needs for its tenants and "
            "idempotency rows; set it for the worker and the process that calls fan_out"
        )
    if binding is None:
        raise ConfigurationError(
            f"fan_out() has no queue port: the Celery app {getattr(app, 'main', None)!r} was "
            "not made by platform_tasks.create_app; call "
            "platform_tasks.fanout.install(app, queue_port) in its composition root, or pass "
            "fan_out(..., port=queue_port)"
        )
    return binding.resolve()


def fan_out(
    ctx: Any,
    *,
    queue: str,
    kind: str,
    data: Mapping[str, Any] | None = None,
    tiers: Literal["due"] | None = None,
    port: Any = None,
    on_complete: Any = None,
) -> uuid.UUID:
    """Hand the fan-out of this point to the reliable queue; return the fan-out job id.

    Its consumer publishes one envelope per tenant on ``queue`` with ``kind``, a shared
    correlation id, ``data`` plus ``data["scheduled_for"]`` (the point, ISO UTC) and a job
    id derived from (job name, point, kind, tenant). ``tiers="due"`` keeps only tenants
    whose freshness tier is due in the point's UTC hour. The job is published with the
    running app's queue port (bound by ``create_app``, or by ``install``); ``port``
    overrides it.

    ``on_complete`` (a :class:`~platform_tasks.batches.Callback` or its mapping): a job
    published once every tenant's job of this point has ended, whatever its outcome; the
    fan-out is then a batch whose id is the returned fan-out job id (see
    :mod:`.completion`; ``platform-tasks batches show <id>``).
    """
    _check_arguments(queue, data, tiers)
    publisher = port if port is not None else bound_port()
    spec = _checked_on_complete(on_complete, publisher)
    job_id = fan_out_job_id(ctx.name, ctx.scheduled_for, kind)
    request: dict[str, Any] = {
        "job": ctx.name,
        "point": ctx.scheduled_for.isoformat(),
        "queue": queue,
        "kind": kind,
        "data": dict(data or {}),
        "tiers": tiers,
    }
    if spec is not None:
        request["on_complete"] = spec
    publisher.publish(
        FANOUT_QUEUE,
        {
            "job_id": str(job_id),
            "tenant_id": FANOUT_TENANT,
            "correlation_id": f"fanout-{job_id}",
            "kind": FANOUT_KIND,
            "data": request,
        },
    )
    _log_requested(job_id, ctx, request)
    return job_id


def _log_requested(job_id: uuid.UUID, ctx: Any, request: Mapping[str, Any]) -> None:
    logger.info(
        "fan-out %s of %s at %s to %s handed to %s",
        job_id,
        ctx.name,
        request["point"],
        request["kind"],
        FANOUT_QUEUE,
        extra={
            "event": "fanout.requested",
            "fanout_job_id": str(job_id),
            "job": ctx.name,
            "point": request["point"],
            "kind": request["kind"],
            "queue": request["queue"],
            "tiers": request["tiers"],
            "on_complete": "on_complete" in request,
        },
    )


def _checked_on_complete(on_complete: Any, port: Any) -> dict[str, Any] | None:
    """The stored spec of ``on_complete``, refused now (naming the field) when it could
    never be published."""
    if on_complete is None:
        return None
    from platform_tasks.batches.callbacks import checked_spec

    return checked_spec("on_complete", on_complete, port)


def _check_arguments(queue: Any, data: Any, tiers: Any) -> None:
    """Refuse what the fan-out's consumer could not use, before anything is published."""
    if tiers not in (None, "due"):
        raise ValueError(f"fan_out: tiers must be None or 'due', got {tiers!r}")
    if not isinstance(queue, str) or not queue:
        raise ValueError("fan_out: queue must be a non-empty queue name")
    if data is not None and not isinstance(data, Mapping):
        raise TypeError(f"fan_out: data must be a mapping, got {type(data).__name__}")
    if data is not None and "scheduled_for" in data:
        raise ValueError("fan_out: data['scheduled_for'] is set by the fan-out (the point)")
