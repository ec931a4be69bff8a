"""``LeaseDatabaseScheduler``: django-celery-beat's schedules, admitted like the platform's jobs.

``celery -A app beat -S platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler``
reads the periodic tasks users edit in Django admin with django-celery-beat's own
``DatabaseScheduler`` (its loading, and its change detection, so an edit is picked up
within a tick), but decides each run the way ``LeaseScheduler`` does:

* every task has one pending point, computed by the platform's pure point rules
  (:mod:`platform_tasks.contrib.periodic_points`), first the point strictly after start-up
  or after the edit that created or changed it. Nothing runs at start-up, on enable or on
  edit; a missed point is never caught up; ``last_run_at`` plays no part;
* a due point is judged by the admission script in Redis (keyed on the task's primary
  key, names being editable): at most once across all replicas, never after its period,
  never while the task's previous run still holds its lease;
* an admitted point is sent through the base class's ``apply_entry`` (so Sentry's beat
  integration and every other ``apply_entry`` hook keep working), with the lease and the
  end of the point's period in the message headers (the worker discards a trigger whose
  period has ended by Redis TIME, never by its own clock);
* only the admitting replica writes the run metadata (``last_run_at`` = the point,
  ``total_run_count``), with a queryset ``update()``: no signal, so no reload anywhere;
* a ``one_off`` task disables itself in the same conditional update that admits it, so it
  is sent once even if two replicas race;
* a warm stop (SIGTERM/SIGINT) during a tick's admission and sends waits until the
  admitted points are sent, like ``LeaseScheduler`` (:mod:`platform_tasks.jobs.warm_stop`); a
  stop that cuts them short logs each one not sent and gives back its lease.

Start-up refuses what it cannot honour (a solar schedule without ``ephem``, an unknown
timezone, a clocked schedule without ``one_off``), naming the periodic task. A task that
becomes invalid through a later edit is logged and left out instead of stopping beat.

Without ``DJANGO_SETTINGS_MODULE`` the standalone settings module
:mod:`platform_tasks.contrib.django_settings` is used (database ``PLATFORM_DATABASE_URL``).
Workers keep the lease while a task runs (:mod:`platform_tasks.contrib.beat_leases`: built
into apps made by ``create_app``, one line for a plain ``Celery()`` app).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import django
from django.apps import apps as django_apps

if not django_apps.ready:  # beat of a Django project has set Django up already
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_tasks.contrib.django_settings")
    django.setup()

from django.db.models import F
from django_celery_beat.models import PeriodicTasks
from django_celery_beat.schedulers import DatabaseScheduler

from platform_tasks.brokers.redis_client import ManagedRedis, check_redis_safe
from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.contrib.beat_leases import LeaseGrant
from platform_tasks.contrib.periodic_points import (
    PeriodicTaskError,
    TaskPoints,
    points_for,
)
from platform_tasks.errors import ConfigurationError
from platform_tasks.headers import LEASE_HEADER
from platform_tasks.jobs.leases import (
    AdmissionOutcome,
    AdmissionRequest,
    JobLeases,
    new_token,
)
from platform_tasks.jobs.points import from_ms
from platform_tasks.jobs.warm_stop import WarmStop
from platform_tasks.keys import django_beat_namespace, periodic_task_job
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["LeaseDatabaseScheduler"]

logger = logging.getLogger("platform_tasks.contrib.django_celery_beat")


@dataclass
class _Pending:
    """One enabled periodic task and its next point."""

    name: str
    pk: int
    one_off: bool
    points: TaskPoints
    point_ms: int | None  # None: the task has no point left


def _settings_of(app: Celery) -> PlatformSettings:
    """A platform app's settings; a plain ``Celery()`` app's come from the environment."""
    settings = getattr(app, "platform_settings", None)
    return settings if isinstance(settings, PlatformSettings) else PlatformSettings()


class LeaseDatabaseScheduler(DatabaseScheduler):
    """django-celery-beat's ``DatabaseScheduler`` with lease admission (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._redis: ManagedRedis | None = None
        self.leases: JobLeases | None = None
        self._pending: dict[int, _Pending] = {}
        self._loaded: Any = None  # the schedule dict the pending points were built from
        self._starting = True
        self._problems: list[PeriodicTaskError] = []
        self._sent = False
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._token_prefix = new_token(self.owner)
        self._tokens = 0
        # token -> (task name, request): admitted, trigger not yet sent
        self._unsent: dict[str, tuple[str, AdmissionRequest]] = {}
        self._warm_stop: WarmStop | None = None
        super().__init__(*args, **kwargs)

    # -- start-up ----------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Connect to Redis, then load and validate every enabled periodic task."""
        super().setup_schedule()
        settings = _settings_of(self.app)
        namespace = django_beat_namespace(
            app_name=str(self.app.main or "celery_app"), profile=settings.profile
        )
        self._warm_stop = WarmStop(
            timeout_seconds=settings.beat_stop_timeout_seconds, owner=self.owner
        )
        self._redis = ManagedRedis(settings)
        try:
            check_redis_safe(self._redis.client)
            self.leases = JobLeases(
                self._redis.client, namespace=namespace, prefix=settings.jobs_key_prefix or ""
            )
            self.leases.load_scripts()
            self._refresh(self.schedule, self._redis_now_ms())
        except Exception:
            self._redis.close()
            raise
        if self._problems:
            problems = "; ".join(str(p) for p in self._problems)
            self._redis.close()
            raise ConfigurationError(f"LeaseDatabaseScheduler cannot start: {problems}")
        self._starting = False
        logger.info(
            "lease database scheduler ready owner=%s tasks=%d namespace=%s",
            self.owner,
            len(self._pending),
            namespace,
            extra={"event": "django_beat.ready"},
        )

    def all_as_schedule(self) -> dict[str, Any]:
        """The base loading, with each task's points checked (start-up refuses a task it
        cannot honour; later it is logged and left out)."""
        schedule: dict[str, Any] = {}
        self._problems = []
        # not `enabled()`, which prefetches: a row whose timezone cannot load would hide all
        for model in self.Model.objects.filter(enabled=True):
            entry = self._checked_entry(model)
            if entry is not None:
                schedule[model.name] = entry
        return schedule

    def _checked_entry(self, model: Any, entry: Any = None) -> Any:
        """The base class's entry with its points, or ``None`` (rejected, logged)."""
        try:
            points = points_for(model)
            entry = entry if entry is not None else self.Entry(model, app=self.app)
        except PeriodicTaskError as exc:
            self._reject(exc)
            return None
        except Exception as exc:
            self._reject(PeriodicTaskError(model.name, model.pk, f"cannot be loaded: {exc}"))
            return None
        entry.platform_points = points
        return entry

    def _reject(self, problem: PeriodicTaskError) -> None:
        self._problems.append(problem)
        if not self._starting:
            logger.error(
                "%s; the task is left out until it is fixed",
                problem,
                extra={"event": "django_beat.task_rejected", "periodic_task": problem.pk},
            )

    # -- ticking -----------------------------------------------------------------------

    def _redis_now_ms(self) -> int:
        assert self.leases is not None
        return redis_now_ms(self.leases.client)

    def _refresh(self, schedule: dict[str, Any], now_ms: int) -> None:
        """Rebuild the pending points after a (re)load: a task whose points did not
        change keeps its pending point; a new, enabled or edited one gets the first point
        strictly after ``now_ms``."""
        pending: dict[int, _Pending] = {}
        for name, entry in list(schedule.items()):
            added = getattr(entry, "platform_points", None) is None  # from beat_schedule
            if added and self._checked_entry(entry.model, entry) is None:
                del schedule[name]
                continue
            model = entry.model
            points: TaskPoints = entry.platform_points
            before = self._pending.get(model.pk)
            if before is not None and before.points == points:
                before.name, before.one_off = model.name, model.one_off
                pending[model.pk] = before
            else:
                pending[model.pk] = _Pending(
                    model.name, model.pk, model.one_off, points, points.next_after_ms(now_ms)
                )
        self._pending = pending
        self._loaded = schedule

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Admit and send every due point; return seconds until the next one (capped)."""
        schedule = self.schedule  # the base class reloads here when an edit happened
        try:
            now_ms = self._redis_now_ms()
        except Exception as exc:
            logger.warning(
                "Redis unavailable, points skipped: %s",
                exc,
                extra={"event": "django_beat.redis_error"},
            )
            return float(self.max_interval)
        if schedule is not self._loaded:
            self._refresh(schedule, now_ms)
        due = [p for p in self._pending.values() if p.point_ms is not None and p.point_ms <= now_ms]
        if due:
            # A warm stop waits until the admitted points are sent (module docstring).
            warm_stop = self._warm_stop
            with warm_stop.deferred() if warm_stop is not None else contextlib.nullcontext():
                self._admit(due, now_ms, schedule)
        upcoming = [p.point_ms for p in self._pending.values() if p.point_ms is not None]
        if not upcoming:
            return float(self.max_interval)
        wait = (min(upcoming) - now_ms) / 1000
        return min(float(self.max_interval), max(0.001, wait))

    def _admit(self, due: list[_Pending], now_ms: int, schedule: dict[str, Any]) -> None:
        assert self.leases is not None
        requests: list[tuple[_Pending, AdmissionRequest]] = []
        for item in due:
            point_ms = self._newest_due(item, now_ms)
            if point_ms is None:
                continue
            end_ms = item.points.period_end_ms(point_ms)
            self._tokens += 1
            requests.append(
                (
                    item,
                    AdmissionRequest(
                        periodic_task_job(item.pk),
                        point_ms,
                        end_ms,
                        f"{self._token_prefix}:{self._tokens}",
                        item.points.lease_ttl_ms(point_ms, end_ms),
                    ),
                )
            )
            item.point_ms = item.points.next_after_ms(point_ms)
        if not requests:
            return
        try:
            answers = self.leases.admit_many([r for _, r in requests])
        except Exception as exc:
            logger.warning(
                "admission of %d point(s) failed, points skipped: %s",
                len(requests),
                exc,
                extra={"event": "django_beat.admission_error"},
            )
            return
        for (item, request), answer in zip(requests, answers, strict=True):
            if not isinstance(answer, Exception) and answer.outcome is AdmissionOutcome.ADMITTED:
                self._unsent[request.token] = (item.name, request)  # first: close() needs it
        for (item, request), answer in zip(requests, answers, strict=True):
            outcome = answer if isinstance(answer, Exception) else answer.outcome
            logger.debug(
                "periodic task point task=%s id=%d point_ms=%d outcome=%s owner=%s",
                item.name,
                item.pk,
                request.point_ms,
                getattr(outcome, "value", outcome),
                self.owner,
                extra={"event": "django_beat.point", "periodic_task": item.pk},
            )
            if outcome is AdmissionOutcome.FUTURE:
                item.point_ms = request.point_ms  # Redis' clock is behind: try again
            elif outcome is AdmissionOutcome.ADMITTED:
                entry = schedule.get(item.name)
                if entry is None or entry.model.pk != item.pk:
                    self._release(request)
                else:
                    self._run(item, entry, request)

    def _newest_due(self, item: _Pending, now_ms: int) -> int | None:
        """The newest point at or before ``now_ms``: older ones are a period late."""
        point = item.point_ms
        while point is not None:
            following = item.points.next_after_ms(point)
            if following is None or following > now_ms:
                return point
            point = following
        return None

    def _run(self, item: _Pending, entry: Any, request: AdmissionRequest) -> None:
        """Record and send one admitted point (one-off: only if it is still enabled)."""
        point = from_ms(request.point_ms)
        rows = self.Model.objects.filter(pk=item.pk)
        if item.one_off:
            rows = rows.filter(enabled=True)
        changes: dict[str, Any] = {
            "last_run_at": point,
            "total_run_count": F("total_run_count") + 1,
        }
        if item.one_off:
            changes["enabled"] = False
        if rows.update(**changes) == 0:  # a one-off another replica already took, or deleted
            self._release(request)
            return
        if item.one_off:
            item.point_ms = None
            PeriodicTasks.update_changed()  # the other replicas drop it at their next tick
        entry.model.last_run_at = point
        entry.last_run_at = point
        entry.total_run_count = entry.model.total_run_count = entry.total_run_count + 1
        if self._send(entry, request):
            self._unsent.pop(request.token, None)
        else:
            self._release(request)

    def _send(self, entry: Any, request: AdmissionRequest) -> bool:
        assert self.leases is not None
        grant = LeaseGrant(
            self.leases.namespace,
            self.leases.prefix,
            request.job,
            request.token,
            request.lease_ttl_ms,
            request.point_ms,
            request.period_end_ms,
        )
        original = entry.options
        headers = dict(original.get("headers") or {})
        headers[LEASE_HEADER] = grant.to_header()
        # The period's end travels in the lease header and is judged by Redis TIME in the
        # worker (beat_leases), not as the message's expiry, which Celery judges by the
        # worker's own clock. A task's own expires is passed on unchanged.
        options = dict(original, headers=headers)
        entry.options = options
        self._sent = False
        try:
            self.apply_entry(entry, producer=self.producer)
        finally:
            entry.options = original
        return self._sent

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """The base send; records that it succeeded (``apply_entry`` swallows errors)."""
        result = super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        self._sent = True
        return result

    def _release(self, request: AdmissionRequest) -> None:
        assert self.leases is not None
        self._unsent.pop(request.token, None)
        try:
            self.leases.release(request.job, token=request.token)
        except Exception as exc:
            logger.warning(
                "lease release failed (it expires by itself): %s",
                exc,
                extra={"event": "django_beat.release_error"},
            )

    def reserve(self, entry: Any) -> Any:
        """Never used to decide runs (``tick`` does); kept harmless for base callers."""
        return entry

    def close(self) -> None:
        """Give back the leases of admitted points not sent (a stop cut the tick
        short: each is logged), save the base class's state, close our Redis client."""
        unsent, self._unsent = self._unsent, {}
        for name, request in unsent.values():
            logger.error(
                "trigger of %s at point_ms=%d not sent (periodic task %r; beat stopped); "
                "its lease is released owner=%s",
                request.job,
                request.point_ms,
                name,
                self.owner,
                extra={
                    "event": "django_beat.trigger_not_sent",
                    "job": request.job,
                    "point_ms": request.point_ms,
                },
            )
            if self.leases is not None:
                self._release(request)
        try:
            super().close()
        finally:
            if self._redis is not None:
                self._redis.close()
                self._redis = None

    @property
    def info(self) -> str:
        return "    . platform lease database scheduler (django-celery-beat)"
