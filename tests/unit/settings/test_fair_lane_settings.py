"""PLATFORM_FAIR_QUEUES and PLATFORM_TENANT_WEIGHTS: parsed, or refused naming the entry."""

from __future__ import annotations

import pytest

from platform_tasks.brokers.selection import transport_conf
from platform_tasks.errors import SettingsError
from platform_tasks.settings import PlatformSettings


def test_fair_queues_and_weights_reach_the_transport_options() -> None:
    settings = PlatformSettings.from_env(
        {"PLATFORM_FAIR_QUEUES": "default, emails", "PLATFORM_TENANT_WEIGHTS": "acme=4,globex=2"}
    )

    options = transport_conf(settings, {})["broker_transport_options"]

    assert options["fair_queues"] == ["default", "emails"]
    assert options["tenant_weights"] == {"acme": 4, "globex": 2}


def test_without_the_setting_no_queue_is_fair() -> None:
    options = transport_conf(PlatformSettings.from_env({}), {})["broker_transport_options"]

    assert "fair_queues" not in options


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("acme", "'acme' is not tenant=weight"),
        ("acme=0", "weight must be between 1 and 1000"),
        ("acme=two", "weight must be a whole number"),
        ("acme=1,acme=2", "tenant 'acme' is named twice"),
        ("bad tenant=2", "is not tenant=weight"),
    ],
)
def test_bad_weights_are_refused_naming_the_variable(value: str, problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        PlatformSettings.from_env({"PLATFORM_TENANT_WEIGHTS": value})

    assert "PLATFORM_TENANT_WEIGHTS" in str(caught.value)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"PLATFORM_TRANSPORT": "stock"}, "needs the platform transport"),
        ({"PLATFORM_BROKER_URL": "amqp://guest@localhost//"}, "applies to a Redis broker"),
    ],
)
def test_fair_queues_where_no_fair_transport_runs_are_refused(
    extra: dict[str, str], problem: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        PlatformSettings.from_env({"PLATFORM_FAIR_QUEUES": "default", **extra})

    assert "PLATFORM_FAIR_QUEUES" in str(caught.value)
    assert problem in str(caught.value)


def test_scripts_sharing_lane_upkeep_are_loaded_with_it_expanded() -> None:
    """``-- include: fair_lane_parts`` is replaced by that file: Redis runs one text."""
    from platform_tasks.brokers.scripts import script_source
    from platform_tasks.headers import TENANT_HEADER
    from platform_tasks.observability.trace_context import PUBLISHED_AT_HEADER

    parts = script_source("fair_lane_parts")
    assert f'"{TENANT_HEADER}"' in parts and f'"{PUBLISHED_AT_HEADER}"' in parts
    for name in ("transport_fair_fetch", "transport_restore"):
        source = script_source(name)
        assert "-- include:" not in source
        assert parts in source
