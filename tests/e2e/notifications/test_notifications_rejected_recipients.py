"""One address the provider refuses costs that email only, not its chunk.

A real worker started as the README says, real Redis and PostgreSQL, the Resend-like
server on loopback, which validates addresses more strictly than the adapter does (as
Resend does): ``bad..dots@example.org`` passes the adapter's check and the provider
refuses it.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import key_of, rig

BAD = "bad..dots@example.org"


def test_chunk_with_one_bad_address_sends_the_other_99_once_and_dead_letters_that_one(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=20/s"}
    with rig(redis_url, database_url, tmp_path, env=env) as r:
        recipients = [f"n{n}@example.org" for n in range(100)]
        recipients[41] = BAD
        job = str(uuid7())
        r.port.publish(
            "notif.email.marketing",
            {
                "job_id": job,
                "tenant_id": "acme",
                "kind": "notify.newsletter",
                "data": {"recipients": recipients, "campaign_id": "spring", "chunk": 0},
            },
        )
        wait_until(lambda: r.dead_letters() == 1, timeout=60, message="a dead letter")
        wait_until(lambda: r.applied(job), timeout=60, message="the chunk applied")
        requests, _ = r.server.snapshot()
        assert [(q.idempotency_key, q.status) for q in requests] == [(key_of(job), 200)]
        r.assert_exactly_once(99)
        assert BAD not in {to for _, to in r.delivered()}
        ((row_job, reason, error),) = r.rows(
            "SELECT job_id::text, reason, last_error FROM core.dead_letters"
        )
        assert (row_job, reason) == (job, "rejected_recipients")
        assert f"email 41 ({BAD})" in error and "Invalid `to` field" in error, error
