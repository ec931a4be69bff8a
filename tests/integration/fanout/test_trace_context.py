"""Fan-out children continue the fan-out job's trace: every batched child message carries
the trace context of the job that fanned out (what a retry or replay of a child carries
on in turn)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import redis

from platform_tasks.fanout import fan_out
from platform_tasks.jobs.runner import JobContext
from platform_tasks.observability.trace_context import PUBLISHED_AT_HEADER, running_with

from .conftest import FanOutHarness, add_tenants, decode

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SENTRY_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736-a3ce929d0e0e4736-1"
POINT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_children_carry_the_fan_out_jobs_trace(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [(f"t-{n:03d}", "1h") for n in range(5)])
    ctx = JobContext(
        name="maintenance.test",
        scheduled_for=POINT,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )
    fan_out(ctx, queue="work", kind="demo.recompute")
    with running_with({"traceparent": TRACEPARENT, "sentry-trace": SENTRY_TRACE}):
        harness.run(
            harness.pending_fan_outs()[0],
            harness.settings.model_copy(update={"fanout_batch_size": 2}),
        )
    children = [decode(raw)[0] for raw in redis_client.lrange("work", 0, -1)]
    assert len(children) == 5
    for message in children:
        headers = message["headers"]
        assert headers["traceparent"] == TRACEPARENT
        assert headers["sentry-trace"] == SENTRY_TRACE
        assert headers[PUBLISHED_AT_HEADER] > 0
