"""The search on a real Redis: a job in a tenant lane of a fair queue (where the fair
transport's fetch script sorted it), one fetched by a worker (kombu's unacked hash), and
one out of publish order (a retry promoted back: found by the full read)."""

from __future__ import annotations

import json

import redis

from platform_tasks.app import platform_queue_port
from platform_tasks.envelope import uuid7
from platform_tasks.jobs_status import StatusReader
from platform_tasks.keys import KOMBU_UNACKED, fair_lane_keys
from platform_tasks.settings import PlatformSettings


def _wire(settings: PlatformSettings, client: redis.Redis, tenant: str) -> tuple[str, bytes]:
    port = platform_queue_port(settings)
    try:
        job = str(
            port.publish("reports", {"tenant_id": tenant, "kind": "reports.build", "data": {}})
        )
    finally:
        port.close()
    raw = client.rpop("reports")
    assert isinstance(raw, bytes)
    return job, raw


def test_lane_fetched_and_out_of_order_jobs_are_found(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    lanes = fair_lane_keys("reports")
    in_lane, lane_wire = _wire(settings, redis_client, "acme")
    fetched, fetched_wire = _wire(settings, redis_client, "acme")
    # an older job pushed after newer ones, as a promoted retry is
    late, late_wire = _wire(settings, redis_client, "globex")
    newer = [_wire(settings, redis_client, "globex") for _ in range(3)]
    redis_client.lpush(lanes.lane("acme"), lane_wire)
    redis_client.rpush(lanes.ring, "acme")
    redis_client.hset(KOMBU_UNACKED, "tag-1", json.dumps([json.loads(fetched_wire), "", "reports"]))
    for _, wire in newer:
        redis_client.lpush("reports", wire)
    redis_client.lpush("reports", late_wire)

    with StatusReader(settings, queues=["reports"]) as reader:
        lane = reader.job(in_lane)
        assert (lane.state, lane.details["queue"], lane.details["tenant"]) == (
            "waiting",
            "reports",
            "acme",
        )
        assert lane.details["ahead"] == 0
        taken = reader.job(fetched)
        assert (taken.state, taken.details["fetched_by_worker"]) == ("waiting", True)
        out_of_order = reader.job(late)
        assert (out_of_order.state, out_of_order.details["ahead"]) == ("waiting", 3)
        assert [reader.job(job).details["ahead"] for job, _ in newer] == [0, 1, 2]
        assert reader.job(str(uuid7())).state == "unknown"


def test_a_correlation_id_lists_its_waiting_jobs_only(settings: PlatformSettings) -> None:
    """The search matches the whole correlation id as the wire message spells it: not the
    jobs of a longer id that starts with it, and an id with a quote or a non-ASCII letter
    (escaped in the message's JSON) still finds its jobs."""
    port = platform_queue_port(settings)
    published: dict[str, list[str]] = {}
    try:
        for correlation_id in ("order-5", "order-50", "order-5 b", 'café "5"'):
            published[correlation_id] = [
                str(
                    port.publish(
                        "reports",
                        {
                            "tenant_id": "acme",
                            "kind": "reports.build",
                            "correlation_id": correlation_id,
                            "data": {},
                        },
                    )
                )
                for _ in range(2)
            ]
    finally:
        port.close()

    with StatusReader(settings, queues=["reports"]) as reader:
        for correlation_id, jobs in published.items():
            listed = reader.correlation(correlation_id)
            assert [status.job_id for status in listed] == jobs, correlation_id
            assert {status.state for status in listed} == {"waiting"}
