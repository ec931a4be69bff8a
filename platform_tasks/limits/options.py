"""The per-key limit options of a PlatformTask, checked when the task is declared.

A team writes::

    @app.task(base=PlatformTask, concurrency_key=lambda envelope: envelope.tenant_id,
              max_concurrency=2, throttle_key=lambda envelope: envelope.tenant_id,
              throttle="10/s")
    def sync_tenant(envelope, tx): ...

and a mistake (a cap without a key, ``max_concurrency=0``, a throttle written ``"10 per
second"``) is a :class:`~platform_tasks.errors.ConfigurationError` naming the task and the
option when the module is imported, not a surprise at the first delivery. This module is
pure: it reads the class, it never talks to Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from platform_tasks.errors import ConfigurationError
from platform_tasks.settings.rate_limits import RateLimit, parse_rate_limits

__all__ = [
    "DEFAULT_CAP_RETRY",
    "DEFAULT_LEASE_TTL",
    "LIMIT_OPTIONS",
    "NO_LIMITS",
    "KeyFunction",
    "LimitSpec",
    "Rate",
    "key_text",
    "limit_spec",
    "parse_rate",
]

Rate = RateLimit
"""``Rate(count, period_seconds)``: the notification limiter's rate, for any task
(``throttle=Rate(10, 1)`` or the text ``throttle="10/s"``)."""

KeyFunction = Callable[[Any], Any]
"""Called with the validated envelope; returns the key (``None``: this job is not limited)."""

LIMIT_OPTIONS = frozenset(
    {
        "concurrency_key",
        "max_concurrency",
        "concurrency_lease_ttl",
        "concurrency_retry",
        "throttle_key",
        "throttle",
        "throttle_total",
    }
)
"""The task options this package adds to ``PlatformTask.platform_options``."""

DEFAULT_LEASE_TTL = timedelta(seconds=30)
"""How long a running job's slot outlives its worker if that worker dies without releasing
it. The slot is renewed every third of it while the job runs, so a long job keeps its slot
and a SIGKILLed worker's slot frees within this long."""

DEFAULT_CAP_RETRY = timedelta(seconds=1)
"""How long a job refused by its cap waits in the delay store before it asks again
(jittered by up to half of it, so waiting jobs do not all come back at once)."""


@dataclass(frozen=True)
class LimitSpec:
    """The limits one task declared (``None`` fields: that limit is off)."""

    concurrency_key: KeyFunction | None = None
    max_concurrency: int | None = None
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    cap_retry: timedelta = DEFAULT_CAP_RETRY
    throttle_key: KeyFunction | None = None
    throttle: RateLimit | None = None
    throttle_total: RateLimit | None = None

    @property
    def limited(self) -> bool:
        """Whether the task declared any limit (else its jobs never ask Redis)."""
        return (
            self.max_concurrency is not None
            or self.throttle is not None
            or (self.throttle_total is not None)
        )


NO_LIMITS = LimitSpec()


def parse_rate(value: Any, *, task: str, option: str) -> RateLimit:
    """A :class:`Rate`, or its text ``"N/s"``, ``"N/min"``, ``"N/h"``."""
    if isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        try:
            parsed = parse_rate_limits(f"x={value.strip()}")
        except ValueError:
            parsed = {}
        if "x" in parsed:
            return parsed["x"]
    raise ConfigurationError(
        f"task {task!r}: {option}={value!r} is not a rate; write Rate(count, period_seconds) "
        "or a text such as '10/s', '600/min' or '5000/h'"
    )


def _seconds(value: Any, *, task: str, option: str) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"task {task!r}: {option} must be a timedelta or a number of seconds, got {value!r}"
        )
    if seconds <= 0:
        raise ConfigurationError(f"task {task!r}: {option} must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def _key_function(value: Any, *, task: str, option: str) -> KeyFunction:
    if not callable(value):
        raise ConfigurationError(
            f"task {task!r}: {option} must be a function of the envelope (e.g. "
            f"{option}=lambda envelope: envelope.tenant_id), got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def limit_spec(cls: type[Any], task: str) -> LimitSpec:
    """Read and check the limit options of a task class; raise naming the bad option.

    The options are class attributes (Celery's ``@app.task`` makes a subclass with them),
    read from the class, so a key function is never bound as a method.
    """
    values = {name: getattr(cls, name, None) for name in LIMIT_OPTIONS}
    cap = values["max_concurrency"]
    _check_pairs(values, task)

    def key(option: str) -> KeyFunction | None:
        value = values[option]
        return None if value is None else _key_function(value, task=task, option=option)

    def seconds(option: str, default: timedelta) -> timedelta:
        value = values[option]
        return default if value is None else _seconds(value, task=task, option=option)

    def rate(option: str) -> RateLimit | None:
        value = values[option]
        return None if value is None else parse_rate(value, task=task, option=option)

    return LimitSpec(
        concurrency_key=key("concurrency_key") if cap is not None else None,
        max_concurrency=cap,
        lease_ttl=seconds("concurrency_lease_ttl", DEFAULT_LEASE_TTL),
        cap_retry=seconds("concurrency_retry", DEFAULT_CAP_RETRY),
        throttle_key=key("throttle_key"),
        throttle=rate("throttle"),
        throttle_total=rate("throttle_total"),
    )


def _check_pairs(values: dict[str, Any], task: str) -> None:
    """The options that only make sense together are given together, and a cap is valid."""
    cap = values["max_concurrency"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigurationError(
            f"task {task!r}: max_concurrency must be a whole number of at least 1, got {cap!r}"
        )
    if (cap is None) != (values["concurrency_key"] is None):
        missing = "concurrency_key" if cap is not None else "max_concurrency"
        raise ConfigurationError(
            f"task {task!r}: {missing} is missing; a concurrency cap needs both "
            "concurrency_key=<function of the envelope> and max_concurrency=N"
        )
    for option in ("concurrency_lease_ttl", "concurrency_retry"):
        if values[option] is not None and cap is None:
            raise ConfigurationError(
                f"task {task!r}: {option} only applies with max_concurrency and concurrency_key"
            )
    if (values["throttle"] is None) != (values["throttle_key"] is None):
        missing = "throttle_key" if values["throttle"] is not None else "throttle"
        raise ConfigurationError(
            f"task {task!r}: {missing} is missing; a per-key throttle needs both "
            "throttle_key=<function of the envelope> and throttle=Rate(...) or '10/s'"
        )


def key_text(function: KeyFunction, envelope: Any) -> str | None:
    """The key a job is limited under: the function's value as text, ``None`` when the
    function says the job is not limited (returns ``None``)."""
    value = function(envelope)
    if value is None:
        return None
    return str(value)
