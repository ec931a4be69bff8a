"""Jobs of several provider requests resume at the first request not answered.

A real worker started as the README says (the app's rails have a two-attempt retry
policy), real Redis and PostgreSQL, the Resend-like server on loopback. ``notify.digest``
renders ``count`` emails: more than 100 go out in several batch requests, request ``n``
under the key ``{job_id}:{n}``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import key_of, rig


def _tries(requests: list[object], job: str) -> Counter[str | None]:
    """How many requests of ``job`` reached the server, per key (replays included)."""
    return Counter(
        q.idempotency_key  # type: ignore[attr-defined]
        for q in requests
        if (q.idempotency_key or "").startswith(job)  # type: ignore[attr-defined]
    )


def test_429_on_the_second_request_resumes_there_without_resending_the_first(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": "resend=20/s"}
    with rig(redis_url, database_url, tmp_path, env=env) as r:
        job = str(uuid7())
        r.server.fail_next(
            429,
            "rate_limit_exceeded",
            headers={"retry-after": "1"},
            message="Too many requests",
            key=key_of(job, 1),
        )
        r.digest("acme", 150, job)
        wait_until(lambda: r.applied(job), timeout=90, message="the digest job applied")
        requests, _ = r.server.snapshot()
        assert [q.status for q in requests if q.idempotency_key == key_of(job, 1)] == [429, 200]
        # request 0's 100 recipients reached the provider once: no replay under its key
        assert _tries(requests, job) == {key_of(job, 0): 1, key_of(job, 1): 2}
        assert r.dead_letters() == 0
        r.assert_exactly_once(150)
        log = r.logs()
        assert "throttled (provider_429); attempt 1" in log
        assert "attempt 2" not in log  # the throttle spent no attempt


def test_tenant_limit_smaller_than_the_job_completes_across_throttles(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """100 messages a second per tenant, a job of 250: three requests, each refused once
    by the tenant's bucket before it fits; none is sent twice."""
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=50/s",
        "PLATFORM_TENANT_RATE_LIMITS": "resend=100/s",
    }
    with rig(redis_url, database_url, tmp_path, env=env) as r:
        job = str(uuid7())
        r.digest("acme", 250, job)
        wait_until(lambda: r.applied(job), timeout=90, message="the digest job applied")
        requests, _ = r.server.snapshot()
        assert _tries(requests, job) == {key_of(job, n): 1 for n in range(3)}
        assert r.logs().count("throttled (tenant_rate_limit)") >= 2
        assert r.dead_letters() == 0
        r.assert_exactly_once(250)


def test_job_its_tenant_bucket_cannot_pass_in_a_day_is_dead_lettered_naming_the_setting(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """One message an hour per tenant: 150 messages would take the tenant's bucket 149 h."""
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=50/s",
        "PLATFORM_TENANT_RATE_LIMITS": "resend=1/h",
    }
    with rig(redis_url, database_url, tmp_path, env=env) as r:
        job = str(uuid7())
        r.digest("acme", 150, job)
        wait_until(lambda: r.dead_letters() == 1, timeout=60, message="the dead letter")
        ((error, error_type, attempts),) = r.rows(
            "SELECT last_error, error_type, attempts FROM core.dead_letters WHERE job_id = %s",
            job,
        )
        assert "PLATFORM_TENANT_RATE_LIMITS" in error and "resend=1/h" in error, error
        assert (error_type, attempts) == ("platform_tasks.errors.PermanentError", 1)
        requests, _ = r.server.snapshot()
        assert _tries(requests, job) == {}
