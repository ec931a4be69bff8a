"""The documented defaults of ``define_job``, as the static reader reports them.

They mirror the signature of :func:`platform_tasks.jobs.define_job` (keyword-only:
``name`` from the path, ``timezone`` UTC, ``enabled`` true, ``lease_ttl`` the period
capped at one hour, ``queue`` ``platform.jobs``). They are restated here rather than
imported so that the reader never imports the scheduling code either.
"""

from __future__ import annotations

from datetime import timedelta

DEFAULT_TIMEZONE = "UTC"
DEFAULT_ENABLED = True
DEFAULT_QUEUE = "platform.jobs"
LEASE_TTL_CAP = timedelta(hours=1)

FIELDS_DEFAULTING_ON_NONE = frozenset(
    {"name", "cron", "interval", "timezone", "lease_ttl", "queue"}
)
"""Fields whose signature default is ``None``: an explicit ``None`` means "use the default"."""

ACCEPTED_KEYWORDS = frozenset(
    {"handler", "name", "cron", "interval", "timezone", "enabled", "lease_ttl", "queue"}
)


def default_lease_ttl(interval: timedelta | None) -> timedelta | None:
    """The lease TTL used when none is given: the period, capped at one hour.

    Only an interval has a single statically known period; for cron the period is
    decided by the scheduler at runtime, so the default is reported without a value.
    """
    if interval is None or interval <= timedelta(0):
        return None
    return min(interval, LEASE_TTL_CAP)
