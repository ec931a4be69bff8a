"""Pure rules of the per-key limits: declaration checks, waits, unique publish arguments."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from platform_tasks import PlatformTask, create_app
from platform_tasks.errors import ConfigurationError
from platform_tasks.limits import Rate
from platform_tasks.limits.admission import cap_wait_ms, due_at
from platform_tasks.limits.concurrency import renew_interval_s
from platform_tasks.limits.options import DEFAULT_LEASE_TTL, key_text, limit_spec
from platform_tasks.limits.unique import unique_publish


def tenant(envelope: Any) -> Any:
    return envelope.tenant_id


_declared = itertools.count()


def declare(**options: Any) -> Any:
    """Declare a task with ``options`` on a fresh app (a new name each time: names are
    process-wide) and return its class."""
    name = f"t.limited{next(_declared)}"
    app = create_app("limits_rules")
    try:

        @app.task(name=name, base=PlatformTask, shared=False, **options)
        def limited(envelope: Any, tx: Any) -> None: ...

        return type(app.tasks[name])
    finally:
        app.close()


def test_a_declared_cap_and_throttle_are_read_from_the_class() -> None:
    cls = declare(
        concurrency_key=tenant,
        max_concurrency=3,
        concurrency_lease_ttl=10,
        throttle_key=tenant,
        throttle="20/min",
        throttle_total=Rate(5, 1),
    )
    spec = cls.platform_limits
    assert spec.concurrency_key is tenant and spec.max_concurrency == 3
    assert spec.lease_ttl == timedelta(seconds=10)
    assert spec.throttle == Rate(20, 60) and spec.throttle_total == Rate(5, 1)
    assert spec.limited


def test_a_task_without_limits_has_none() -> None:
    spec = declare().platform_limits
    assert not spec.limited and spec.lease_ttl == DEFAULT_LEASE_TTL


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"max_concurrency": 2}, "concurrency_key is missing"),
        ({"concurrency_key": tenant}, "max_concurrency is missing"),
        ({"concurrency_key": tenant, "max_concurrency": 0}, "max_concurrency must be"),
        ({"concurrency_key": tenant, "max_concurrency": True}, "max_concurrency must be"),
        ({"concurrency_key": tenant, "max_concurrency": "2"}, "max_concurrency must be"),
        ({"concurrency_key": "tenant_id", "max_concurrency": 2}, "concurrency_key must be a"),
        (
            {"concurrency_key": tenant, "max_concurrency": 2, "concurrency_lease_ttl": -1},
            "concurrency_lease_ttl must be positive",
        ),
        ({"concurrency_lease_ttl": 5}, "concurrency_lease_ttl only applies"),
        ({"throttle": "10/s"}, "throttle_key is missing"),
        ({"throttle_key": tenant}, "throttle is missing"),
        ({"throttle_key": tenant, "throttle": "10 per second"}, "throttle='10 per second'"),
        ({"throttle_total": 5}, "throttle_total=5 is not a rate"),
        ({"max_concurency": 2}, "unknown task option 'max_concurency'"),
    ],
)
def test_a_wrong_limit_option_fails_at_declaration_naming_it(
    options: dict[str, Any], names: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"t\.limited") as raised:
        declare(**options)
    assert names in str(raised.value)


def test_limit_spec_reads_a_function_unbound_from_the_class() -> None:
    class Options:
        concurrency_key = staticmethod(tenant)
        max_concurrency = 1

    assert limit_spec(Options, "x").concurrency_key is tenant


def test_key_text_is_text_and_none_means_not_limited() -> None:
    assert key_text(lambda envelope: 42, object()) == "42"
    assert key_text(lambda envelope: None, object()) is None


def test_a_refused_job_waits_its_retry_plus_up_to_half_of_it() -> None:
    retry = timedelta(seconds=1)
    assert cap_wait_ms(retry, draw=lambda: 0.0) == 1000
    assert cap_wait_ms(retry, draw=lambda: 0.999) == 1499
    assert cap_wait_ms(timedelta(microseconds=1), draw=lambda: 0.0) == 1


def test_due_at_counts_from_the_redis_clock() -> None:
    assert due_at(1_700_000_000_000, 250) == datetime.fromtimestamp(1_700_000_000.25, tz=UTC)


def test_leases_are_renewed_every_third_of_their_ttl() -> None:
    assert renew_interval_s(30_000) == 10.0
    assert renew_interval_s(3_000) == 1.0
    assert renew_interval_s(10) == 0.05


def test_unique_publish_arguments() -> None:
    assert unique_publish(None, None, None) is None
    request = unique_publish("k", timedelta(seconds=2), None)
    assert request is not None and (request.key, request.ttl_ms, request.mode) == (
        "k",
        2000,
        "skip",
    )
    debounce = unique_publish("k", timedelta(seconds=2), "debounce")
    assert debounce is not None and debounce.mode == "debounce"
    with pytest.raises(ValueError, match="unique_for must be a positive timedelta"):
        unique_publish("k", None, None)
    with pytest.raises(ValueError, match="unique_for must be a positive timedelta"):
        unique_publish("k", timedelta(0), None)
    with pytest.raises(ValueError, match="unique_mode must be 'skip' or 'debounce'"):
        unique_publish("k", timedelta(seconds=1), "drop")
    with pytest.raises(ValueError, match="unique_for and unique_mode need unique_key"):
        unique_publish(None, timedelta(seconds=1), None)
    with pytest.raises(ValueError, match="unique_key must be a non-empty text"):
        unique_publish("", timedelta(seconds=1), None)
