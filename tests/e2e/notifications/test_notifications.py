"""Notification rails with real workers, Redis, PostgreSQL and a Resend-like server.

Workers are started as the README says (``celery -A app worker``, no ``-Q``); the app
(tests/apps/notifications_app.py) gives the rails a two-attempt retry policy, so any
throttle that spent an attempt would show up as a dead letter.
"""

from __future__ import annotations

from pathlib import Path

import redis

from platform_tasks.keys import rate_limit_keys
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import key_of, rig


def test_tenant_exhausting_its_bucket_does_not_delay_another(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=50/s",
        "PLATFORM_TENANT_RATE_LIMITS": "resend=10/min",
    }
    with rig(redis_url, database_url, tmp_path, env=env) as r:
        greedy = [r.receipt("greedy", n) for n in range(40)]
        wait_until(lambda: len(r.delivered()) >= 10, timeout=60, message="greedy's first 10")
        polite = [r.receipt("polite", n) for n in range(8)]
        polite_keys = {key_of(job) for job in polite}

        def polite_done() -> bool:
            return polite_keys <= {k for k, _ in r.delivered()}

        wait_until(polite_done, timeout=60, message="every polite email")
        greedy_keys = {key_of(job) for job in greedy}
        sent_greedy = {k for k, _ in r.delivered()} & greedy_keys
        # greedy's bucket (10 at once, then one every 6 s) still holds the rest back while
        # every polite email went out
        assert len(sent_greedy) <= 14
        assert len(greedy_keys - sent_greedy) >= 26
        assert r.dead_letters() == 0
        r.assert_exactly_once(len(sent_greedy) + 8)


def test_429_retry_after_stops_every_worker_and_loses_nothing(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """Two workers; the server answers one 429 with ``retry-after: 3``.

    Requests that took their token before the 429 was known may still arrive just after
    it was answered (a grace of 0.5 s); after that nobody sends until the 3 s are over.
    """
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=20/s"}
    with rig(redis_url, database_url, tmp_path, workers=2, env=env) as r:
        jobs = [r.receipt("acme", n) for n in range(30)]
        wait_until(lambda: len(r.delivered()) >= 5, timeout=60, message="first emails")
        r.server.fail_next(
            429, "rate_limit_exceeded", headers={"retry-after": "3"}, message="Too many requests"
        )
        wait_until(
            lambda: any(q.status == 429 for q in r.server.snapshot()[0]),
            timeout=60,
            message="the scripted 429",
        )
        wait_until(lambda: len(r.delivered()) == 30, timeout=120, message="all 30 emails")
        requests, _ = r.server.snapshot()
        (refused,) = [q for q in requests if q.status == 429]
        # the back-off starts when the 429 is answered (the request itself may have
        # arrived earlier: it is stamped when its bytes reached the server's machine)
        known = refused.answered
        quiet = [q for q in requests if known + 0.5 < q.at < known + 3.0]
        assert quiet == [], (
            f"{len(quiet)} request(s) during the back-off: the 429 arrived at "
            f"{refused.at:.3f}, answered at {known:.3f} (key {refused.idempotency_key}); "
            + ", ".join(f"{q.at - known:+.3f} s key {q.idempotency_key}" for q in quiet)
        )
        assert r.dead_letters() == 0
        assert {k for k, _ in r.delivered()} == {key_of(job) for job in jobs}
        r.assert_exactly_once(30)


def test_quota_429_pauses_the_provider_alerts_once_and_keeps_every_job(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=20/s"}
    with rig(redis_url, database_url, tmp_path, workers=2, env=env) as r:
        client = redis.Redis.from_url(redis_url)
        r.server.exhaust_quota(4)
        jobs = [r.receipt("acme", n) for n in range(12)]
        bucket = rate_limit_keys("test", "resend").bucket
        wait_until(
            lambda: client.hexists(bucket, "paused_until"), timeout=60, message="provider paused"
        )
        wait_until(lambda: len(r.delivered()) == 12, timeout=120, message="all 12 after reset")
        requests, _ = r.server.snapshot()
        refused = [q for q in requests if q.name == "daily_quota_exceeded"]
        assert 1 <= len(refused) <= 4  # only requests already under way when it paused
        assert r.logs().count("alert: provider resend is paused") == 1
        assert r.dead_letters() == 0
        assert {k for k, _ in r.delivered()} == {key_of(job) for job in jobs}
        r.assert_exactly_once(12)
        client.close()
