"""Worker side of ``LeaseDatabaseScheduler``: hold a periodic task's lease while it runs.

Beat admits a point only while no lease of the task is held, takes the lease with the
admission and puts it in the message headers (``platform_lease``). In the worker, the
handlers below renew it every ``ttl / 3`` while the task runs and release it when the
task ends (success or failure) or is revoked before it ran (an expired trigger). A worker
that dies stops renewing, so the lease expires after its TTL (the task's period, at least
a minute, at most an hour) and the next point runs again.

Apps built with :func:`platform_tasks.create_app` have this installed (:func:`install`).
Nothing here imports Django: a worker needs only the platform's Redis setting. A plain
``Celery()`` app installs it in the module the workers load::

    from platform_tasks.contrib.beat_leases import install_lease_renewal
    install_lease_renewal(app)

A worker whose app has neither and receives a trigger carrying a lease logs that line once
(``beat_leases.not_installed``; the handlers reach such a worker through the ``celery``
command plugin :mod:`platform_tasks.contrib.celery_command`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery.signals import task_postrun, task_prerun, task_received, task_revoked
from celery.worker import state as worker_state

from platform_tasks.brokers.redis_client import REDIS_ERRORS, ManagedRedis
from platform_tasks.brokers.scripts import script_source
from platform_tasks.headers import LEASE_HEADER
from platform_tasks.jobs.leases import JobLeases, LeaseOutcome
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from celery import Celery

    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "LEASE_HEADER",
    "LeaseGrant",
    "connect_handlers",
    "install",
    "install_lease_renewal",
    "on_received",
    "renews_leases",
]

logger = logging.getLogger("platform_tasks.contrib.beat_leases")


@dataclass(frozen=True)
class LeaseGrant:
    """The lease of one admitted point, as it travels in the message headers."""

    namespace: str
    prefix: str
    job: str
    token: str
    ttl_ms: int
    point_ms: int
    period_end_ms: int | None = None  # judged by Redis TIME when the worker receives it

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {
            "namespace": self.namespace,
            "prefix": self.prefix,
            "job": self.job,
            "token": self.token,
            "ttl_ms": self.ttl_ms,
            "point_ms": self.point_ms,
        }
        if self.period_end_ms is not None:
            header["period_end_ms"] = self.period_end_ms
        return header

    @classmethod
    def from_request(cls, request: Any) -> LeaseGrant | None:
        """The grant in a task request's headers, or ``None`` (not a leased trigger)."""
        value = None
        # a task's request context, then a worker Request (revoked before it ran)
        for holder in (getattr(request, "headers", None), getattr(request, "request_dict", None)):
            if isinstance(holder, Mapping) and holder.get(LEASE_HEADER) is not None:
                value = holder[LEASE_HEADER]
                break
        if value is None:
            value = getattr(request, LEASE_HEADER, None)
        if not isinstance(value, Mapping):
            return None
        try:
            end = value.get("period_end_ms")
            return cls(
                str(value["namespace"]),
                str(value.get("prefix") or ""),
                str(value["job"]),
                str(value["token"]),
                int(value["ttl_ms"]),
                int(value["point_ms"]),
                None if end is None else int(end),
            )
        except (KeyError, TypeError, ValueError):
            logger.warning(
                "ignoring a malformed %s header",
                LEASE_HEADER,
                extra={"event": "beat_leases.bad_header"},
            )
            return None


class _Renewer(threading.Thread):
    def __init__(self, leases: JobLeases, grant: LeaseGrant) -> None:
        super().__init__(name=f"platform-lease-{grant.job}", daemon=True)
        self.leases = leases
        self.grant = grant
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.grant.ttl_ms / 3000.0):
            try:
                outcome, _ = self.leases.renew(
                    self.grant.job, token=self.grant.token, lease_ttl_ms=self.grant.ttl_ms
                )
            except REDIS_ERRORS as exc:
                logger.warning(
                    "lease renewal of %s failed: %s",
                    self.grant.job,
                    exc,
                    extra={"event": "beat_leases.renew_error"},
                )
                continue
            if outcome is not LeaseOutcome.RENEWED:
                holder = self.leases.lease_holder(self.grant.job)
                logger.warning(
                    "lease of %s was lost while the task runs (now held by %s); its next "
                    "point may overlap",
                    self.grant.job,
                    holder or "nobody",
                    extra={"event": "beat_leases.lease_lost"},
                )
                return


class _LeaseKeeper:
    """One per worker process: the Redis client and the renewers of running tasks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._redis: ManagedRedis | None = None
        self._leases: dict[tuple[str, str], JobLeases] = {}
        self._running: dict[str, _Renewer] = {}
        self._duplicates: set[str] = set()  # task ids discarded as already run
        self._claim: Any = None
        self.settings: PlatformSettings | None = None

    def _leases_for(self, grant: LeaseGrant) -> JobLeases:
        with self._lock:
            if self._redis is None:
                self._redis = ManagedRedis(self.settings or PlatformSettings())
            key = (grant.namespace, grant.prefix)
            leases = self._leases.get(key)
            if leases is None:
                leases = self._leases[key] = JobLeases(
                    self._redis.client, namespace=grant.namespace, prefix=grant.prefix
                )
            return leases

    def received(self, request: Any, grant: LeaseGrant) -> None:
        """In the worker's main process, before the trigger runs: claim its point. A
        trigger of a point already taken (redelivered after a worker died before its
        ack, or a duplicate message) is discarded like a revoked task; its lease is
        left to the run that took the point. A trigger whose period has ended by Redis
        TIME (not this worker's clock) is discarded as expired and gives its lease back."""
        leases = self._leases_for(grant)
        with self._lock:
            if self._claim is None:
                self._claim = leases.client.register_script(script_source("claim_run"))
            claim = self._claim
        try:
            end = "" if grant.period_end_ms is None else grant.period_end_ms
            verdict = claim(keys=[leases.keys(grant.job).ran], args=[grant.point_ms, end])
        except REDIS_ERRORS as exc:
            logger.warning(
                "could not claim the run of %s at point_ms=%d, it runs: %s",
                grant.job,
                grant.point_ms,
                exc,
                extra={"event": "beat_leases.claim_error"},
            )
            return
        verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
        if verdict == "run":
            return
        if verdict == "late":
            logger.info(
                "trigger of %s at point_ms=%d discarded: its period ended at %d by Redis TIME",
                grant.job,
                grant.point_ms,
                grant.period_end_ms,
                extra={"event": "beat_leases.trigger_expired", "job": grant.job},
            )
            # Celery's own expiry path (task_revoked with expired=True, lease released)
            request.expires = datetime(1970, 1, 1, tzinfo=UTC)
            return
        task_id = str(getattr(request, "id", ""))
        with self._lock:
            self._duplicates.add(task_id)
        worker_state.revoked.add(task_id)
        logger.warning(
            "trigger %s of %s at point_ms=%d discarded: that point was already taken to run "
            "(a redelivered or duplicate trigger)",
            task_id,
            grant.job,
            grant.point_ms,
            extra={
                "event": "beat_leases.duplicate_trigger",
                "job": grant.job,
                "point_ms": grant.point_ms,
            },
        )

    def started(self, task_id: str, request: Any) -> None:
        grant = LeaseGrant.from_request(request)
        if grant is None:
            return
        leases = self._leases_for(grant)
        try:
            # At once, not after ttl / 3: the trigger may have waited in the queue for
            # most of its lease. Taken back if it lapsed meanwhile and nobody holds it.
            outcome, _ = leases.renew(
                grant.job, token=grant.token, lease_ttl_ms=grant.ttl_ms, reacquire=True
            )
        except REDIS_ERRORS as exc:
            logger.warning(
                "lease renewal of %s failed: %s",
                grant.job,
                exc,
                extra={"event": "beat_leases.renew_error"},
            )
        else:
            if outcome is not LeaseOutcome.RENEWED:
                logger.warning(
                    "%s starts without its lease (another point holds it): runs may overlap",
                    grant.job,
                    extra={"event": "beat_leases.lease_lost"},
                )
        renewer = _Renewer(leases, grant)
        with self._lock:
            self._running[task_id] = renewer
        renewer.start()

    def ended(self, task_id: str, request: Any) -> None:
        with self._lock:
            renewer = self._running.pop(task_id, None)
            if task_id in self._duplicates:  # discarded at receipt: the lease is not ours
                self._duplicates.discard(task_id)
                return
        if renewer is not None:
            renewer.stopped.set()
        grant = renewer.grant if renewer is not None else LeaseGrant.from_request(request)
        if grant is None:
            return
        try:
            self._leases_for(grant).release(grant.job, token=grant.token)
        except REDIS_ERRORS as exc:
            logger.warning(
                "could not release the lease of %s (it expires by itself): %s",
                grant.job,
                exc,
                extra={"event": "beat_leases.release_error"},
            )


_KEEPER = _LeaseKeeper()

INSTALL_LINE = (
    "from platform_tasks.contrib.beat_leases import install_lease_renewal; "
    "install_lease_renewal(app)"
)
"""The line a plain ``Celery()`` app's module needs (named by the missing-install warning)."""

_renewing_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
_renewing_everywhere = False
_warned_not_installed = False


def renews_leases(app: Celery | None) -> bool:
    """True when this process renews and releases the leases of ``app``'s triggers."""
    return _renewing_everywhere or (app is not None and app in _renewing_apps)


def _app_of(task: Any) -> Celery | None:
    app: Celery | None = getattr(task, "_app", None) or getattr(task, "app", None)
    return app


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is not None and task is not None and renews_leases(_app_of(task)):
        _KEEPER.started(task_id, task.request)


def _on_postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is not None and task is not None and renews_leases(_app_of(task)):
        _KEEPER.ended(task_id, task.request)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None and renews_leases(_app_of(sender)):
        _KEEPER.ended(str(getattr(request, "id", "")), request)


def on_received(request: Any = None, **_: Any) -> None:
    """In the worker's main process, for every message it takes: the point of a trigger
    carrying a lease is claimed (:meth:`_LeaseKeeper.received`); a trigger that this
    worker's app does not renew is reported instead (once per process)."""
    global _warned_not_installed
    if request is None:
        return
    grant = LeaseGrant.from_request(request)
    if grant is None:
        return
    if renews_leases(_app_of(getattr(request, "task", None))):
        _KEEPER.received(request, grant)
        return
    if _warned_not_installed:
        return
    _warned_not_installed = True
    logger.warning(
        "task %s arrived with a periodic task's lease (header %s, sent by "
        "LeaseDatabaseScheduler) but this worker does not renew or release those leases: "
        "each run keeps its lease for the lease's whole TTL (at least a minute) and the "
        "points in between are skipped. Build the app with platform_tasks.create_app, or add "
        "to the Celery app module the workers load: %s",
        getattr(request, "name", "?"),
        LEASE_HEADER,
        INSTALL_LINE,
        extra={"event": "beat_leases.not_installed"},
    )


def connect_handlers() -> None:
    """Connect the worker signal handlers (idempotent). They act only for apps registered
    by :func:`install_lease_renewal`; for others they report the missing line."""
    task_received.connect(on_received, weak=False, dispatch_uid="platform_tasks.lease.received")
    task_prerun.connect(_on_prerun, weak=False, dispatch_uid="platform_tasks.lease.prerun")
    task_postrun.connect(_on_postrun, weak=False, dispatch_uid="platform_tasks.lease.postrun")
    task_revoked.connect(_on_revoked, weak=False, dispatch_uid="platform_tasks.lease.revoked")


def install_lease_renewal(app: Celery | None = None) -> None:
    """Renew and release the leases of triggers sent by ``LeaseDatabaseScheduler`` in
    this app's workers (Redis from ``app.platform_settings`` or ``PLATFORM_REDIS_URL``).
    Without an app, for every app of the process."""
    global _renewing_everywhere
    settings = getattr(app, "platform_settings", None)
    if isinstance(settings, PlatformSettings):
        _KEEPER.settings = settings
    if app is None:
        _renewing_everywhere = True
    else:
        _renewing_apps.add(app)
    connect_handlers()


def install(app: PlatformCelery) -> None:
    """:func:`install_lease_renewal` for an app built by ``create_app`` (it needs no
    choice from the user: a worker without it holds every lease for its whole TTL)."""
    install_lease_renewal(app)
