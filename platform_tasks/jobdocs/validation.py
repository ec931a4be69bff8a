"""The start-up rules a static reader can already enforce on known values.

These are the same errors beat would raise at start-up (bad cron, unknown timezone,
both or neither schedule), found in CI before any process starts. Only *known* values
are judged: an unknown value is missing evidence, never assumed valid or invalid.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import NamedTuple, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from platform_tasks.jobdocs.evidence import FieldEvidence, FieldState
from platform_tasks.jobdocs.resolve import LiteralValue

__all__ = ["PendingCron", "cron_problem", "validate_fields"]

_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)

# Every check below is cached per distinct literal: a project repeats a handful of cron
# expressions and zones across thousands of files.


@cache
def valid_timezone(name: str) -> bool:
    """What ``define_job`` accepts: a name :class:`~zoneinfo.ZoneInfo` can load."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


@cache
def _cron_problem(expr: LiteralValue) -> str | None:
    if not isinstance(expr, str):
        return f"{expr!r} is not a string"
    from croniter import croniter  # only projects with cron jobs pay for its import

    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        return f"{expr!r} is not a valid 5-field cron expression"
    return None


@cache
def _has_future_point(expr: str) -> bool:
    from croniter import CroniterBadDateError, croniter

    try:
        croniter(expr, _REFERENCE).get_next(datetime)
    except CroniterBadDateError:
        return False
    return True


class PendingCron(NamedTuple):
    """A known cron literal whose checks were left for later: they need croniter, whose
    import costs as much as reading a few hundred job files, so a parallel run pays it
    once, in one process, instead of before forking."""

    expr: LiteralValue
    enabled: bool


def cron_problem(pending: PendingCron) -> str | None:
    """The cron violation :func:`validate_fields` would have reported, if any."""
    problem = _cron_problem(pending.expr)
    if problem:
        return problem
    if pending.enabled and not _has_future_point(str(pending.expr)):
        return f"{pending.expr!r} has no representable future point"
    return None


def _duration_problem(name: str, value: LiteralValue) -> str | None:
    if not isinstance(value, timedelta):
        return f"{value!r} is not a timedelta"
    if value < timedelta(seconds=1):
        return f"{name} must be at least 1 second, got {value}"
    if name == "interval" and value % timedelta(milliseconds=1):
        return f"interval must be a whole number of milliseconds, got {value}"
    return None


def _name_problem(name: LiteralValue) -> str | None:
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
        return f"{name!r} is not a non-empty string without spaces"
    if "{" in name or "}" in name:
        return f"{name!r} must not contain braces (they delimit Redis hash tags)"
    return None


def _enabled(fields: dict[str, FieldEvidence], known: dict[str, LiteralValue]) -> bool:
    return fields["enabled"].state is FieldState.ABSENT or known.get("enabled") is True


def _present(field: FieldEvidence) -> bool:
    return field.state is not FieldState.ABSENT


@overload
def validate_fields(
    fields: dict[str, FieldEvidence], known: dict[str, LiteralValue]
) -> list[tuple[str | None, str]]: ...


@overload
def validate_fields(
    fields: dict[str, FieldEvidence], known: dict[str, LiteralValue], *, defer_cron: bool
) -> list[tuple[str | None, str | PendingCron]]: ...


def validate_fields(
    fields: dict[str, FieldEvidence], known: dict[str, LiteralValue], *, defer_cron: bool = False
) -> list[tuple[str | None, str]] | list[tuple[str | None, str | PendingCron]]:
    """``(field, message)`` for every rule the known values break. With ``defer_cron``, a
    known cron's checks come back as a :class:`PendingCron` in the place its message
    would take, to be settled with :func:`cron_problem`."""
    problems: list[tuple[str | None, str | PendingCron]] = []
    has_cron, has_interval = _present(fields["cron"]), _present(fields["interval"])
    if has_cron and has_interval:
        problems.append((None, "both cron and interval are given; exactly one is required"))
    if not has_cron and not has_interval:
        problems.append((None, "neither cron nor interval is given; exactly one is required"))
    if _present(fields["timezone"]) and has_interval and not has_cron:
        problems.append(("timezone", "timezone applies to cron schedules only"))

    name_problem = _name_problem(known["name"]) if "name" in known else None
    if name_problem:
        problems.append(("name", name_problem))
    if "cron" in known:
        pending = PendingCron(known["cron"], _enabled(fields, known))
        if defer_cron:
            problems.append(("cron", pending))
        else:
            message = cron_problem(pending)
            if message:
                problems.append(("cron", message))
    for duration in ("interval", "lease_ttl"):
        if duration in known:
            duration_message = _duration_problem(duration, known[duration])
            if duration_message:
                problems.append((duration, duration_message))
    if "timezone" in known:
        zone = known["timezone"]
        if not isinstance(zone, str) or not valid_timezone(zone):
            problems.append(("timezone", f"{zone!r} is not a known IANA timezone"))
    if "enabled" in known and not isinstance(known["enabled"], bool):
        problems.append(("enabled", f"{known['enabled']!r} is not a boolean"))
    queue = known.get("queue")
    if "queue" in known and (not isinstance(queue, str) or not queue.strip()):
        problems.append(("queue", f"{known['queue']!r} is not a non-empty string"))
    return problems
