"""Start-up of scheduled jobs, shared by beat and the workers.

Both validate the same way before any work: settings (already validated by the app
factory), discovery (names, cron, zones, future points), and, only when a job is active,
a reachable Redis that cannot evict job keys. "Start-up" for the strictly-future rule is
the moment this validation finishes, measured on the Redis clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from platform_tasks.app_state import AppState
from platform_tasks.brokers.redis_client import ManagedRedis, check_redis_safe
from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.jobs.discovery import JobSet, discover_from_settings
from platform_tasks.jobs.leases import JobLeases, resolve_namespace
from platform_tasks.jobs.points import from_ms
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["LIVE", "TEST", "JobRuntime", "runtime_mode", "start_jobs"]

logger = logging.getLogger("platform_tasks.jobs")

LIVE = "live"
TEST = "test"
_MODE: AppState[str] = AppState("platform_jobs_mode")


def runtime_mode(app: PlatformCelery) -> str:
    """``test`` for apps built by :mod:`platform_tasks.testing`, else ``live``."""
    mode = _MODE.get(app)
    return LIVE if mode is None else mode


def mark_test_app(app: PlatformCelery) -> None:
    """Make ``app``'s beat and workers schedule no job (:data:`TEST` mode)."""
    _MODE.set(app, TEST)


def app_name(app: PlatformCelery) -> str:
    """The package name the namespace is derived from: the Celery app's main module."""
    return str(app.main or "celery_app")


@dataclass
class JobRuntime:
    """Validated jobs plus, when any is active, the Redis client and lease scripts."""

    jobs: JobSet
    ready_at: datetime
    redis: ManagedRedis | None = None
    leases: JobLeases | None = None
    namespace: str = ""
    closed: bool = field(default=False)

    def close(self) -> None:
        if self.redis is not None and not self.closed:
            self.redis.close()
        self.closed = True


def _redis_now(client: Any) -> datetime:
    return from_ms(redis_now_ms(client))


def start_jobs(
    settings: PlatformSettings,
    *,
    app_name: str,
    mode: str = LIVE,
    client: Any | None = None,
    role: str,
) -> JobRuntime:
    """Discover and validate; raise a :class:`ConfigurationError` naming the culprit.

    An app in ``test`` mode schedules nothing. ``client`` is used (and left open) when
    given, otherwise one is built from ``PLATFORM_REDIS_URL`` and owned by the runtime.
    """
    if mode == TEST:
        return JobRuntime(JobSet(), datetime.now(UTC))
    jobs = discover_from_settings(settings, now=datetime.now(UTC))
    namespace, prefix = resolve_namespace(settings, app_name=app_name, mode=mode)
    if not jobs.active:
        logger.info(
            "%s: %d job(s), none active; Redis not needed",
            role,
            len(jobs),
            extra={"event": "jobs.none_active"},
        )
        return JobRuntime(jobs, datetime.now(UTC), namespace=namespace)
    managed = ManagedRedis(settings, client)
    try:
        check_redis_safe(managed.client)
        ready_at = _redis_now(managed.client)
        # Re-check against the Redis clock: a job must have a point after start-up.
        for job in jobs.active:
            job.schedule.next_after(ready_at)
        leases = JobLeases(managed.client, namespace=namespace, prefix=prefix)
        leases.load_scripts()
    except Exception:
        managed.close()
        raise
    logger.info(
        "%s ready: %d job(s), %d active, namespace %s",
        role,
        len(jobs),
        len(jobs.active),
        namespace,
        extra={"event": "jobs.ready", "role": role},
    )
    return JobRuntime(jobs, ready_at, managed, leases, namespace)
