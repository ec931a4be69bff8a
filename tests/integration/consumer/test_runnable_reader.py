"""The runnable gauge when the platform's Redis cannot be read: left out (never a wrong
number), the queue length still served, one warning per outage."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from platform_tasks import create_app
from platform_tasks.brokers.queue_latency import QueueCollector
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import RedisServer


def _series(collector: QueueCollector) -> dict[str, dict[str, float]]:
    return {
        family.name: {
            s.labels.get("queue") or s.labels["queue_name"]: s.value for s in family.samples
        }
        for family in collector.collect()
        if family.name in ("celery_queue_length", "platform_queue_runnable")
    }


def test_an_unreadable_platform_redis_leaves_the_runnable_gauge_out_and_warns_once(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    platform_redis = RedisServer(tmp_path / "redis").start()
    try:
        settings = PlatformSettings.build(
            redis_url=platform_redis.url, broker_url=redis_url, profile="test"
        )
        app = create_app("runnable_unreadable", settings=settings)
        collector = QueueCollector(app)
        assert _series(collector)["platform_queue_runnable"]["default"] == 0
    finally:
        platform_redis.stop()  # the platform's Redis goes away; the broker's stays
    with caplog.at_level(logging.WARNING):
        first = _series(collector)
        second = _series(collector)
    assert first["celery_queue_length"]["default"] == 0
    assert first["platform_queue_runnable"] == {} and second["platform_queue_runnable"] == {}
    warned = [
        r for r in caplog.records if getattr(r, "event", "") == "metrics.runnable_unavailable"
    ]
    assert len(warned) == 1
    app.close()
