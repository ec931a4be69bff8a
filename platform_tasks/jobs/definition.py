"""``define_job``: one scheduled job, validated the moment its file is imported.

Validation happens at declaration so a bad cron, an unknown zone or a wrong type fails
start-up with the file and the argument named, before beat ticks or a worker consumes.
A definition made while :mod:`platform_tasks.jobs.discovery` imports a file is recorded
by the active collector; that is how discovery learns which file defined which job.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from platform_tasks.errors import JobDefinitionError

__all__ = ["DEFAULT_QUEUE", "MAX_DEFAULT_LEASE", "JobDefinition", "define_job"]

DEFAULT_QUEUE = "platform.jobs"
"""Queue the job runner task is sent to unless a definition names another."""

MAX_DEFAULT_LEASE = timedelta(hours=1)
"""The default ``lease_ttl`` is the job's period, capped at this."""

JobHandler = Callable[[Any], Any]


@dataclass(frozen=True)
class JobDefinition:
    """A validated scheduled job. ``name`` is ``None`` until discovery infers it."""

    handler: JobHandler
    cron: str | None
    interval: timedelta | None
    name: str | None
    timezone: str
    enabled: bool
    lease_ttl: timedelta | None
    queue: str
    file: str | None = field(default=None, compare=False)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def with_origin(self, *, name: str, file: str) -> JobDefinition:
        """The same definition with the inferred name and the file it came from."""
        return JobDefinition(
            handler=self.handler,
            cron=self.cron,
            interval=self.interval,
            name=self.name or name,
            timezone=self.timezone,
            enabled=self.enabled,
            lease_ttl=self.lease_ttl,
            queue=self.queue,
            file=file,
        )


_collector: contextvars.ContextVar[list[JobDefinition] | None] = contextvars.ContextVar(
    "platform_jobs_collector", default=None
)
_current_file: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "platform_jobs_current_file", default=None
)


@contextmanager
def collecting(file: str) -> Iterator[list[JobDefinition]]:
    """Record every ``define_job`` call made while ``file`` is imported."""
    found: list[JobDefinition] = []
    token = _collector.set(found)
    file_token = _current_file.set(file)
    try:
        yield found
    finally:
        _collector.reset(token)
        _current_file.reset(file_token)


def _fail(message: str, field_name: str) -> JobDefinitionError:
    return JobDefinitionError(message, file=_current_file.get(), field=field_name)


def _check_cron(cron: object) -> str:
    if not isinstance(cron, str):
        raise _fail(f"must be a 5-field cron string, got {type(cron).__name__}", "cron")
    fields = cron.split()
    if len(fields) != 5:
        raise _fail(f"{cron!r} must have exactly 5 fields (minute hour day month weekday)", "cron")
    if not croniter.is_valid(cron):
        raise _fail(f"{cron!r} is not a valid cron expression", "cron")
    return " ".join(fields)


def _check_interval(interval: object) -> timedelta:
    if not isinstance(interval, timedelta):
        raise _fail(f"must be a datetime.timedelta, got {type(interval).__name__}", "interval")
    if interval < timedelta(seconds=1):
        raise _fail(f"must be at least 1 second, got {interval}", "interval")
    if interval % timedelta(milliseconds=1):
        raise _fail(f"must be a whole number of milliseconds, got {interval}", "interval")
    return interval


def _check_timezone(timezone: object, *, cron: str | None) -> str:
    if timezone is None:
        return "UTC"
    if cron is None:
        raise _fail("only applies to cron jobs (intervals align to the Unix epoch)", "timezone")
    if not isinstance(timezone, str) or not timezone:
        raise _fail("must be an IANA zone name such as 'Europe/Berlin'", "timezone")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise _fail(f"unknown IANA timezone {timezone!r}", "timezone") from None
    return timezone


def _check_name(name: object) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
        raise _fail(f"must be a non-empty string without spaces, got {name!r}", "name")
    if any(c in name for c in "{}"):
        raise _fail(f"must not contain braces (they delimit Redis hash tags): {name!r}", "name")
    return name


def define_job(
    *,
    handler: JobHandler,
    cron: str | None = None,
    interval: timedelta | None = None,
    name: str | None = None,
    timezone: str | None = None,
    enabled: bool = True,
    lease_ttl: timedelta | None = None,
    queue: str | None = None,
) -> JobDefinition:
    """Declare the one scheduled job of a file in ``beat_schedules/``.

    Exactly one of ``cron`` (5 fields, evaluated in ``timezone``, default UTC) or
    ``interval`` (aligned to the Unix epoch). ``handler`` is a module-level callable
    ``run(ctx)``. ``lease_ttl`` defaults to the period capped at one hour; ``queue`` to
    ``platform.jobs``. Raises :class:`JobDefinitionError` naming the bad argument.
    """
    if not callable(handler):
        raise _fail(f"must be a callable run(ctx), got {type(handler).__name__}", "handler")
    if (cron is None) == (interval is None):
        raise _fail("give exactly one of cron or interval", "cron" if cron else "interval")
    checked_cron = _check_cron(cron) if cron is not None else None
    checked_interval = _check_interval(interval) if interval is not None else None
    zone = _check_timezone(timezone, cron=checked_cron)
    if not isinstance(enabled, bool):
        raise _fail(f"must be True or False, got {enabled!r}", "enabled")
    if lease_ttl is not None and (
        not isinstance(lease_ttl, timedelta) or lease_ttl < timedelta(seconds=1)
    ):
        raise _fail(f"must be a timedelta of at least 1 second, got {lease_ttl!r}", "lease_ttl")
    if queue is not None and (not isinstance(queue, str) or not queue.strip()):
        raise _fail(f"must be a non-empty queue name, got {queue!r}", "queue")
    definition = JobDefinition(
        handler=handler,
        cron=checked_cron,
        interval=checked_interval,
        name=_check_name(name),
        timezone=zone,
        enabled=enabled,
        lease_ttl=lease_ttl,
        queue=queue or DEFAULT_QUEUE,
        file=_current_file.get(),
    )
    found = _collector.get()
    if found is not None:
        found.append(definition)
    return definition
