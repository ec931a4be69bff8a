"""A cancel by tenant stops every chunk of a blast, whatever its job ids look like.

Blast chunk ids are hashes with the version-7 bits set: no publish time can be read out
of them (some read as years past 9999). The cancel judges "published before the cancel"
from the publish time the message carries. Real CLI, Redis broker, PostgreSQL, a worker
started as the README says, and the Resend-like server counting what is sent.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import delay_keys
from platform_tasks.notifications import publish_blast
from platform_tasks.notifications.blasts import blast_job_id
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import rig
from tests.support.operations import Shell

ENV = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=50/s"}
LAST_DATETIME_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() * 1000)


def _overflowing_ids(count: int) -> list[uuid.UUID]:
    """Hash ids like a blast's whose 48-bit prefix reads as a time past the year 9999."""
    found = []
    for n in range(10_000):
        job_id = blast_job_id("acme", "later", [f"delayed-{n}@example.org"])
        if (job_id.int >> 80) > LAST_DATETIME_MS:
            found.append(job_id)
            if len(found) == count:
                return found
    raise AssertionError("no overflowing id found")


def test_cancel_by_tenant_stops_every_chunk_of_a_blast_and_its_delayed_jobs(
    redis_url: str, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("blast_publisher", settings=settings))
    later_on = datetime.now(UTC) + timedelta(hours=1)
    delayed = _overflowing_ids(3)
    try:
        chunks = publish_blast(
            port,
            kind="notify.newsletter",
            tenant_id="acme",
            campaign_id="spring",
            recipients=[f"r{n}@example.org" for n in range(30)],
            chunk_size=1,
        )
        for job_id in delayed:
            payload = {
                "job_id": str(job_id),
                "tenant_id": "acme",
                "kind": "notify.newsletter",
                "data": {"campaign_id": "later", "chunk": 0, "recipients": ["d@example.org"]},
            }
            port.schedule("notif.email.marketing", payload, later_on)
    finally:
        port.close()
    assert len(set(chunks)) == 30

    shell = Shell(redis_url, database_url)
    result = shell.run("jobs", "cancel", "--tenant", "acme", "--yes")
    assert result.returncode == 0, result.stderr
    assert "cancelled 3 delayed job(s)" in result.stdout
    assert redis_client.zcard(delay_keys("test").schedule) == 0

    with rig(redis_url, database_url, tmp_path, env=ENV) as r:
        after = r.receipt("other", 1)  # published after the cancel, another tenant: runs
        mine_after = publish_blast(  # the cancelled tenant's blast after the cancel: runs
            r.port,
            kind="notify.newsletter",
            tenant_id="acme",
            campaign_id="summer",
            recipients=["late@example.org"],
        )

        def settled() -> bool:
            cancelled = r.rows(
                "SELECT count(*) FROM core.dead_letters WHERE reason = 'cancelled' "
                "AND job_id = ANY(%s::uuid[])",
                [str(job) for job in [*chunks, *delayed]],
            )[0][0]
            return bool(cancelled == 33 and r.applied(after) and r.applied(str(mine_after[0])))

        wait_until(
            settled,
            timeout=180,
            interval=0.25,
            message="every chunk cancelled and the later jobs sent",
        )
        _, emails = r.server.snapshot()
        sent = sorted(recipient for email in emails for recipient in email.to)
        assert sent == ["late@example.org", "other-1@example.org"]
        logs = r.logs()
    assert "unavailable" not in logs
    assert "ValueError" not in logs
