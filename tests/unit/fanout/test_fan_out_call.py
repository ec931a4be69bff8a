"""``fan_out`` hands one job to the queue port, with an id derived from job and point."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from platform_tasks.errors import ConfigurationError, SettingsError
from platform_tasks.fanout import FANOUT_KIND, FANOUT_QUEUE, FanOutRequest, fan_out
from platform_tasks.fanout.call import _BINDING
from platform_tasks.fanout.ids import fan_out_job_id
from platform_tasks.jobs.runner import JobContext
from platform_tasks.settings import PlatformSettings

POINT = datetime(2025, 1, 1, 3, tzinfo=UTC)


class RecordingPort:
    """Stands in for QueuePort in this unit test: records what would be published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, Any]]] = []

    def publish(self, queue: str, payload: dict[str, Any]) -> uuid.UUID:
        self.published.append((queue, payload))
        return uuid.UUID(payload["job_id"])


def ctx(name: str = "maintenance.partitions", point: datetime = POINT) -> JobContext:
    return JobContext(name=name, scheduled_for=point, cancel_requested=threading.Event(),
                      logger=logging.getLogger("test"))  # fmt: skip


def test_hands_one_fan_out_job_to_the_reliable_queue() -> None:
    port = RecordingPort()
    job_id = fan_out(ctx(), queue="maintenance", kind="maintenance.create_partitions",
                     data={"days_ahead": 3}, port=port)  # fmt: skip
    assert job_id == fan_out_job_id("maintenance.partitions", POINT,
                                    "maintenance.create_partitions")  # fmt: skip
    [(queue, payload)] = port.published
    assert queue == FANOUT_QUEUE
    assert payload["kind"] == FANOUT_KIND
    assert payload["job_id"] == str(job_id)
    request = FanOutRequest.model_validate(payload["data"])
    assert (request.job, request.point, request.queue) == ("maintenance.partitions", POINT,
                                                           "maintenance")  # fmt: skip
    assert (request.kind, request.data, request.tiers) == (
        "maintenance.create_partitions", {"days_ahead": 3}, None)  # fmt: skip


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


def test_without_a_bound_port_the_error_says_how_to_bind_one() -> None:
    saved = dict(_BINDING)
    _BINDING.clear()
    try:
        with pytest.raises(ConfigurationError, match=r"fanout.install\(app, queue_port\)"):
            fan_out(ctx(), queue="q", kind="a.b")
    finally:
        _BINDING.update(saved)


def test_tenants_query_setting_is_checked_for_shape() -> None:
    with pytest.raises(SettingsError, match="PLATFORM_TENANTS_QUERY"):
        PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": "DROP TABLE tenants"})
    settings = PlatformSettings.from_env(
        {"PLATFORM_TENANTS_QUERY": "select id as tenant_id, 'nightly' as freshness_tier from t"}
    )
    assert settings.tenants_query is not None
    assert PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": "  "}).tenants_query is None
