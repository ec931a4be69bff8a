"""``fan_out`` hands one job to the queue port, with an id derived from job and point."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from celery._state import get_current_app

from platform_tasks.errors import ConfigurationError, SettingsError
from platform_tasks.fanout import FANOUT_KIND, FANOUT_QUEUE, FanOutRequest, fan_out, install
from platform_tasks.fanout.call import bound_port
from platform_tasks.fanout.ids import fan_out_job_id
from platform_tasks.jobs.runner import JobContext
from platform_tasks.publishing.queue_port import QueuePort
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app

POINT = datetime(2025, 1, 1, 3, tzinfo=UTC)


class RecordingPort:
    """Stands in for QueuePort in this unit test: records what would be published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, Any]]] = []

    def publish(self, queue: str, payload: dict[str, Any]) -> uuid.UUID:
        self.published.append((queue, payload))
        return uuid.UUID(payload["job_id"])


def ctx(name: str = "maintenance.partitions", point: datetime = POINT) -> JobContext:
    return JobContext(
        name=name,
        scheduled_for=point,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )


def test_hands_one_fan_out_job_to_the_reliable_queue() -> None:
    port = RecordingPort()
    job_id = fan_out(
        ctx(),
        queue="maintenance",
        kind="maintenance.create_partitions",
        data={"days_ahead": 3},
        port=port,
    )
    assert job_id == fan_out_job_id(
        "maintenance.partitions", POINT, "maintenance.create_partitions"
    )
    [(queue, payload)] = port.published
    assert queue == FANOUT_QUEUE
    assert payload["kind"] == FANOUT_KIND
    assert payload["job_id"] == str(job_id)
    request = FanOutRequest.model_validate(payload["data"])
    assert (request.job, request.point, request.queue) == (
        "maintenance.partitions",
        POINT,
        "maintenance",
    )
    assert (request.kind, request.data, request.tiers) == (
        "maintenance.create_partitions",
        {"days_ahead": 3},
        None,
    )


def test_a_trigger_delivered_twice_hands_over_the_same_job_id() -> None:
    port = RecordingPort()
    first = fan_out(ctx(), queue="q", kind="a.b", port=port)
    second = fan_out(ctx(), queue="q", kind="a.b", port=port)
    assert first == second
    assert port.published[0] == port.published[1]


def test_bad_arguments_are_refused() -> None:
    port = RecordingPort()
    with pytest.raises(ValueError, match="tiers must be None or 'due'"):
        fan_out(ctx(), queue="q", kind="a.b", tiers="all", port=port)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue must be a non-empty"):
        fan_out(ctx(), queue="", kind="a.b", port=port)
    with pytest.raises(ValueError, match="scheduled_for"):
        fan_out(ctx(), queue="q", kind="a.b", data={"scheduled_for": "x"}, port=port)
    assert port.published == []


def test_an_app_not_made_by_create_app_gets_an_error_saying_how_to_bind_a_port() -> None:
    previous = get_current_app()
    Celery("plain_celery_app", set_as_current=True)
    try:
        expected = (
            r"'plain_celery_app' was not made by platform_tasks.create_app; "
            r"call platform_tasks.fanout.install\(app, queue_port\)"
        )
        with pytest.raises(ConfigurationError, match=expected):
            fan_out(ctx(), queue="q", kind="a.b")
    finally:
        previous.set_current()


def test_install_on_a_plain_celery_app_binds_the_port_and_registers_no_consumer() -> None:
    previous = get_current_app()
    platform_app = create_test_app("fanout_platform_side", settings=PlatformSettings())
    plain = Celery("plain_fan_out_caller", set_as_current=True)
    try:
        port = QueuePort(platform_app)
        install(plain, port)
        assert bound_port(plain) is port
        assert FANOUT_KIND not in plain.tasks  # the consumer runs on the platform app's workers
    finally:
        previous.set_current()


def test_a_create_app_app_publishes_with_its_own_port_and_install_can_bind_another() -> None:
    previous = get_current_app()
    app = create_test_app(
        "fanout_bound_app",
        settings=PlatformSettings.build(
            redis_url="redis://127.0.0.1:1/0",
            database_url="postgresql://u@127.0.0.1:1/db",
            profile="test",
        ),
    )
    try:
        assert FANOUT_KIND in app.tasks
        own = bound_port()
        assert isinstance(own, QueuePort) and own.app is app
        assert bound_port() is own  # one port per app and process
        other = RecordingPort()
        install(app, other)
        job_id = fan_out(ctx(), queue="q", kind="a.b")
        assert [payload["job_id"] for _, payload in other.published] == [str(job_id)]
    finally:
        previous.set_current()


def test_a_create_app_app_without_a_database_has_no_fan_out_consumer_and_says_why() -> None:
    """A beat-only or job-only app has no database: its workers must still start (the
    fan-out consumer would make them refuse), and fan_out names the missing setting."""
    previous = get_current_app()
    app = create_test_app(
        "fanout_no_database_app",
        settings=PlatformSettings.build(
            redis_url="redis://127.0.0.1:1/0", database_url=None, profile="test"
        ),
    )
    try:
        assert FANOUT_KIND not in app.tasks
        with pytest.raises(ConfigurationError, match="no PLATFORM_DATABASE_URL"):
            fan_out(ctx(), queue="q", kind="a.b")
    finally:
        previous.set_current()


def test_tenants_query_setting_is_checked_for_shape() -> None:
    with pytest.raises(SettingsError, match="PLATFORM_TENANTS_QUERY"):
        PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": "DROP TABLE tenants"})
    settings = PlatformSettings.from_env(
        {"PLATFORM_TENANTS_QUERY": "select id as tenant_id, 'nightly' as freshness_tier from t"}
    )
    assert settings.tenants_query is not None
    assert PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": "  "}).tenants_query is None
