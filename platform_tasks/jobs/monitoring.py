"""Sentry for scheduled job runs: Crons check-ins and the failure event.

When Sentry is on (the application's client, or ``SENTRY_DSN``), every run of a job
sends an ``in_progress`` check-in when its handler starts and ``ok`` or ``error`` when it
ends, to the monitor whose slug is the job's name. Each check-in carries the monitor
configuration taken from the definition (Sentry creates or updates the monitor from it),
so Sentry notices a point that never ran (missed) as well as a run that failed.

Only the worker that won a point runs it, so each point is one check-in pair whatever the
number of beat replicas. A point skipped by the platform's rules (late, lease lost)
sends nothing: Sentry reports it as missed. Nothing here raises: monitoring must never
stop a job from running.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from platform_tasks.jobs.definition import JobDefinition
from platform_tasks.observability import alerts

__all__ = ["CheckIn", "monitor_config", "monitor_slug", "run_failed", "run_finished", "run_started"]

logger = logging.getLogger("platform_tasks.jobs")

_SLUG_MAX = 50  # Sentry's limit on a monitor slug
_NOT_SLUG = re.compile(r"[^a-z0-9_-]+")
# Sentry interval units, largest first, in minutes (its smallest unit).
_UNITS = (("week", 7 * 24 * 60), ("day", 24 * 60), ("hour", 60), ("minute", 1))


@dataclass(frozen=True)
class CheckIn:
    """An ``in_progress`` check-in that still needs its final status."""

    slug: str
    check_in_id: str
    started: float  # time.monotonic()
    config: dict[str, Any]


def monitor_slug(name: str) -> str:
    """The monitor slug of job ``name``: the name itself when it is a valid slug;
    otherwise lowercased, other characters replaced by ``-`` (as Sentry would), cut at
    Sentry's 50 characters."""
    return _NOT_SLUG.sub("-", name.lower()).strip("-")[:_SLUG_MAX] or "job"


def monitor_config(definition: JobDefinition) -> dict[str, Any]:
    """Sentry's monitor configuration for a definition: its schedule and timezone.

    A cron job is a ``crontab`` schedule in its zone. An interval is an ``interval``
    schedule in whole minutes (Sentry's smallest unit), rounded up, so a job that runs
    more often than every minute is expected at least once a minute.
    """
    if definition.cron is not None:
        schedule: dict[str, Any] = {"type": "crontab", "value": definition.cron}
    else:
        assert definition.interval is not None
        minutes = max(1, math.ceil(definition.interval / timedelta(minutes=1)))
        unit, size = next((u, s) for u, s in _UNITS if minutes % s == 0)
        schedule = {"type": "interval", "value": minutes // size, "unit": unit}
    return {"schedule": schedule, "timezone": definition.timezone}


def run_started(name: str, definition: JobDefinition) -> CheckIn | None:
    """Send the ``in_progress`` check-in of a run; ``None`` when Sentry is off."""
    try:
        if not alerts.sentry_enabled():
            return None
        from sentry_sdk.crons import capture_checkin

        slug, config = monitor_slug(name), monitor_config(definition)
        check_in_id = capture_checkin(
            monitor_slug=slug,
            status="in_progress",
            monitor_config=config,  # type: ignore[arg-type]
        )
        if check_in_id is None:
            return None
        return CheckIn(slug, check_in_id, time.monotonic(), config)
    except Exception as exc:
        logger.warning(
            "Sentry check-in of %s failed: %s",
            name,
            exc,
            extra={"event": "jobs.checkin_failed", "job": name},
        )
        return None


def run_finished(check_in: CheckIn | None, *, succeeded: bool) -> None:
    """Send the final ``ok`` or ``error`` check-in of a run started with a check-in."""
    if check_in is None:
        return
    try:
        from sentry_sdk.crons import capture_checkin

        capture_checkin(
            monitor_slug=check_in.slug,
            check_in_id=check_in.check_in_id,
            status="ok" if succeeded else "error",
            duration=time.monotonic() - check_in.started,
            monitor_config=check_in.config,  # type: ignore[arg-type]
        )
    except Exception as exc:
        logger.warning(
            "Sentry check-in of %s failed: %s",
            check_in.slug,
            exc,
            extra={"event": "jobs.checkin_failed"},
        )


def run_failed(name: str, exc: BaseException) -> None:
    """Send a handler's exception to Sentry once (the runner logs it as ``jobs.run_failed``),
    grouped by job and error type, without the local variables of its frames."""
    error_type = type(exc).__qualname__
    alerts.report_exception(
        exc,
        message=f"job {name} failed: {error_type}",
        tags={"job": name},
        fingerprint=["platform-job-failed", name, f"{type(exc).__module__}.{error_type}"],
    )
