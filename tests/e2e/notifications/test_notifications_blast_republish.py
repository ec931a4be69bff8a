"""A blast published again (reordered, recipients added or removed) reaches each recipient once.

Real worker (started as the README says, no ``-Q``), real Redis and PostgreSQL, the
Resend-like server on loopback. Each publish is waited for until every job it returned is
settled (a ``core.processed_jobs`` row), so nothing the assertions count is still on its way.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psycopg2
import redis

from platform_tasks.keys import delay_keys
from platform_tasks.notifications import publish_blast
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import Rig, rig

ENV = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=50/s"}


def _blast(r: Rig, recipients: Sequence[str]) -> list[uuid.UUID]:
    return publish_blast(
        r.port,
        kind="notify.newsletter",
        tenant_id="acme",
        campaign_id="spring",
        recipients=recipients,
    )


def _settled(database_url: str, job_ids: Sequence[uuid.UUID]) -> bool:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT count(DISTINCT job_id) FROM core.processed_jobs "
                "WHERE job_id = ANY(%s::uuid[])",
                ([str(j) for j in job_ids],),
            )
            return int(cur.fetchone()[0]) == len(set(job_ids))
    finally:
        conn.close()


def _wait_settled(r: Rig, job_ids: Sequence[uuid.UUID], what: str) -> None:
    wait_until(lambda: _settled(r.database_url, job_ids), timeout=180, interval=0.2, message=what)


def _received(r: Rig) -> Counter[str]:
    _, emails = r.server.snapshot()
    return Counter(recipient for email in emails for recipient in email.to)


def test_republish_shuffled_with_ten_added_reaches_everyone_exactly_once(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    first = [f"r{n}@example.org" for n in range(250)]
    second = first + [f"new{n}@example.org" for n in range(10)]
    random.Random(20260).shuffle(second)
    with rig(redis_url, database_url, tmp_path, env=ENV) as r:
        _wait_settled(r, _blast(r, first), "the first publish")
        assert _received(r) == Counter(first)
        _wait_settled(r, _blast(r, second), "the second publish")
        received = _received(r)
        assert sorted(set(second) - set(received)) == [], "never received"
        assert {who: n for who, n in received.items() if n != 1} == {}, "received twice"
        assert set(received) == set(second)
        assert r.dead_letters() == 0


def test_republish_with_recipients_removed_sends_nothing_twice(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    first = [f"r{n}@example.org" for n in range(250)]
    fewer = [who for n, who in enumerate(first) if n % 7 != 3]
    random.Random(5).shuffle(fewer)
    with rig(redis_url, database_url, tmp_path, env=ENV) as r:
        _wait_settled(r, _blast(r, first), "the first publish")
        _wait_settled(r, _blast(r, fewer), "the second publish")
        assert _received(r) == Counter(first)
        assert r.dead_letters() == 0


def test_two_publishes_in_flight_at_once_reach_everyone_exactly_once(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """Two workers of two processes each take chunks of both publishes at the same time,
    so chunks holding the same recipients are claimed concurrently."""
    first = [f"r{n}@example.org" for n in range(400)]
    second = first[50:] + [f"new{n}@example.org" for n in range(30)]
    random.Random(3).shuffle(second)
    with rig(redis_url, database_url, tmp_path, workers=2, env=ENV) as r:
        ids = _blast(r, first) + _blast(r, second)
        _wait_settled(r, ids, "both publishes")
        received = _received(r)
        assert {who: n for who, n in received.items() if n != 1} == {}, "received twice"
        assert set(received) == set(first) | set(second)
        assert r.dead_letters() == 0


def test_a_bounded_blast_never_holds_more_jobs_in_redis_than_its_bound(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """A provider at 10 requests/s makes the worker throttle chunks into the delay store;
    what the blast holds in Redis (queue plus delay store) is sampled while it publishes
    and never exceeds ``max_in_flight``, and every recipient still gets one email."""
    bound = 5
    recipients = [f"r{n}@example.org" for n in range(300)]
    client = redis.Redis.from_url(redis_url)
    entries = delay_keys("test").entries
    held: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pipe = client.pipeline(transaction=True)
            pipe.llen("notif.email.marketing").hlen(entries)
            queued, delayed = pipe.execute()
            held.append(int(queued) + int(delayed))
            done.wait(0.005)  # sampling period of the observer, not synchronisation

    with rig(
        redis_url, database_url, tmp_path, env={"PLATFORM_PROVIDER_RATE_LIMITS": "resend=10/s"}
    ) as r:
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            ids = publish_blast(
                r.port,
                kind="notify.newsletter",
                tenant_id="acme",
                campaign_id="bounded",
                recipients=recipients,
                chunk_size=10,
                max_in_flight=bound,
            )
            _wait_settled(r, ids, "the bounded blast")
        finally:
            done.set()
            sampler.join(timeout=10)
            client.close()
        assert len(ids) == 30
        assert max(held) <= bound, max(held)
        assert max(held) >= 1  # the sampler saw the blast at all
        assert _received(r) == Counter(recipients)
        assert r.dead_letters() == 0
