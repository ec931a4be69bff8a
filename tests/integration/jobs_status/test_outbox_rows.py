"""Jobs still in ``core.outbox`` (committed, not relayed yet) listed by correlation id on
real PostgreSQL: a row is listed when its message's correlation id is the one asked,
whole, in each form the outbox stores (a Redis wire message, a delayed Redis entry that
holds the wire message as a JSON string, a unique publish's request), never because the
id is a prefix of another or appears elsewhere in the message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg2

from platform_tasks.app import platform_queue_port
from platform_tasks.jobs_status import StatusReader
from platform_tasks.settings import PlatformSettings


def test_a_correlation_id_lists_its_outbox_rows_only(settings: PlatformSettings) -> None:
    port = platform_queue_port(settings)
    conn = psycopg2.connect(settings.database_url)
    later = datetime.now(UTC) + timedelta(hours=1)
    published: dict[str, list[str]] = {}
    try:
        # "acme" is also the tenant of every job: found in every message, listed by none
        for correlation_id in ("order-5", "order-50", 'café "5"', "acme"):
            payload = {
                "tenant_id": "acme",
                "kind": "reports.build",
                "correlation_id": correlation_id,
                "data": {},
            }
            with conn:
                published[correlation_id] = [
                    str(port.publish("reports", payload, tx=conn)),
                    str(port.schedule("reports", payload, later, tx=conn)),
                    str(
                        port.publish(
                            "reports",
                            payload,
                            tx=conn,
                            unique_key=f"k-{correlation_id}",
                            unique_for=timedelta(hours=1),
                        )
                    ),
                ]
    finally:
        conn.close()
        port.close()

    with StatusReader(settings, queues=["reports"]) as reader:
        for correlation_id, jobs in published.items():
            listed = reader.correlation(correlation_id)
            assert sorted(status.job_id for status in listed) == sorted(jobs), correlation_id
            assert {status.details["reason"] for status in listed} == {"outbox"}
