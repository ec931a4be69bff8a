"""Operations on a RabbitMQ broker: a paused queue's worker stops consuming, and a cancel
by tenant settles the tenant's queued (and natively delayed) jobs as the worker reaches
them, without running them; each gets its accounting row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from platform_tasks import QueuePort
from platform_tasks.operations import JobFilter, cancel_jobs, pause_queue, resume_queue
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE
from tests.e2e.brokers.rabbitmq.conftest import Workers, query


def job(tenant: str, key: str) -> dict[str, Any]:
    return {"tenant_id": tenant, "kind": "tests.consumer.apply", "data": {"key": key}}


def test_pause_then_cancel_by_tenant_on_rabbitmq(
    port: QueuePort, workers: Workers, broker_settings: PlatformSettings
) -> None:
    database_url = str(broker_settings.database_url)
    worker = workers.start()
    pause_queue(broker_settings, QUEUE, actor="tester")
    worker.wait_for_log(f"queue {QUEUE} paused on this worker", timeout=30)

    soon = datetime.now(UTC) + timedelta(seconds=1)
    gone = [str(port.publish(QUEUE, job("gone", f"g{n}"))) for n in range(20)]
    gone.append(str(port.schedule(QUEUE, job("gone", "g-late"), soon)))  # RabbitMQ's own delay
    stay = [str(port.publish(QUEUE, job("stay", f"s{n}"))) for n in range(10)]
    result = cancel_jobs(broker_settings, JobFilter(tenant_id="gone"), actor="tester")
    assert result.delayed_cancelled == 0  # native delays cannot be swept: the rule has them
    resume_queue(broker_settings, QUEUE, actor="tester")

    def settled() -> bool:
        applied = query(database_url, "SELECT count(*) FROM public.consumer_work")[0][0]
        cancelled = query(
            database_url, "SELECT count(*) FROM core.dead_letters WHERE reason = 'cancelled'"
        )[0][0]
        return bool(applied == 10 and cancelled == 21)

    wait_until(
        settled,
        timeout=120,
        interval=0.25,
        message="stay's jobs to run and gone's to be accounted for",
    )
    ran = query(database_url, "SELECT job_id::text FROM public.consumer_work")
    assert sorted(row[0] for row in ran) == sorted(stay)
    rows = query(database_url, "SELECT job_id::text, status, discard_reason FROM core.dead_letters")
    assert sorted(row[0] for row in rows) == sorted(gone)
    assert {(row[1], row[2]) for row in rows} == {
        ("discarded", f"cancelled by operation {result.operation.id}")
    }
