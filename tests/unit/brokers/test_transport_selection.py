"""The sweep interval rule and broker scheme parsing of the transport selection."""

from __future__ import annotations

import pytest

from platform_tasks.brokers.selection import broker_scheme, sweep_interval


@pytest.mark.parametrize("visibility", [0.5, 1, 2, 5, 30, 300, 3600])
def test_sweep_is_never_longer_than_the_visibility_timeout(visibility: float) -> None:
    assert 0 < sweep_interval(visibility) <= visibility


def test_sweep_interval_defaults() -> None:
    assert sweep_interval(300) == 10
    assert sweep_interval(8) == 2
    assert sweep_interval(2) == 1


def test_configured_interval_is_capped_by_the_visibility_timeout() -> None:
    assert sweep_interval(5, 60) == 5
    assert sweep_interval(300, 3) == 3
    assert sweep_interval(300, 0) == 10


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("redis://h:6379/0", "redis"),
        ("REDISS://h:6380/0", "rediss"),
        ("sentinel://a:26379;sentinel://b:26379", "sentinel"),
        ("celery+redis://h/0", "redis"),
    ],
)
def test_broker_scheme(url: str, scheme: str) -> None:
    assert broker_scheme(url) == scheme
