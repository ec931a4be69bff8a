"""``platform_queue_waiting_by_tenant``: the largest tenants of a fair queue, bounded."""

from __future__ import annotations

from kombu import Connection

from platform_tasks import create_app
from platform_tasks.brokers.transport.fair_metrics import FairQueueCollector
from platform_tasks.settings import PlatformSettings
from tests.integration.transport.conftest import ConnectionFactory
from tests.integration.transport.test_fair_lanes import _publish


def _samples(collector: FairQueueCollector) -> dict[str, float]:
    (family,) = list(collector.collect())
    return {s.labels["tenant"]: s.value for s in family.samples if s.labels["queue"] == "fairq"}


def test_waiting_by_tenant_names_the_top_tenants_and_sums_the_rest(
    connect: ConnectionFactory, redis_url: str
) -> None:
    conn: Connection = connect(fair_queues=["fairq"])
    tenants = ["big"] * 6 + ["mid"] * 4 + ["small"] * 2 + [f"t{n}" for n in range(5)] + [None]
    _publish(conn, tenants)
    settings = PlatformSettings.build(redis_url=redis_url, fair_queues="fairq", profile="test")
    collector = FairQueueCollector(create_app("fair_metrics", settings=settings), top=3)

    assert _samples(collector) == {"(other)": 0, "(arriving)": 18}

    taken = conn.default_channel.basic_get("fairq", no_ack=True)  # sorts, takes one "big"
    assert taken is not None

    assert _samples(collector) == {
        "big": 5,
        "mid": 4,
        "small": 2,
        "(other)": 6,  # t0..t4 and the job without a tenant
        "(arriving)": 0,
    }
