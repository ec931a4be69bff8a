"""The worker side of ``LeaseDatabaseScheduler``'s leases, against a real Redis: a run
releases its lease when it ends, a trigger revoked before it ran (expired) releases it
too, and a lease another admission took is never touched."""

from __future__ import annotations

from types import SimpleNamespace

import redis
from celery import Celery

from platform_tasks.contrib import beat_leases
from platform_tasks.contrib.beat_leases import LEASE_HEADER, LeaseGrant
from platform_tasks.jobs.leases import AdmissionOutcome, JobLeases
from platform_tasks.settings import PlatformSettings

NAMESPACE = "platform:tests:test:django-celery-beat"


def _admit(leases: JobLeases, job: str, token: str, point_ms: int) -> LeaseGrant:
    admission = leases.admit(
        job,
        point_ms=point_ms,
        period_end_ms=point_ms + 3_600_000,
        token=token,
        lease_ttl_ms=60_000,
        now_ms=point_ms,
    )
    assert admission.outcome is AdmissionOutcome.ADMITTED
    return LeaseGrant(NAMESPACE, "", job, token, 60_000, point_ms)


def test_lease_released_when_the_task_ends_or_is_revoked(
    redis_client: redis.Redis, redis_url: str
) -> None:
    leases = JobLeases(redis_client, namespace=NAMESPACE)
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = Celery("leases", set_as_current=False)
    app.platform_settings = settings
    beat_leases.install_lease_renewal(app)
    ran = _admit(leases, "periodic-task-1", "beat-a:1", 1_000_000)
    # a task's request context carries the custom headers
    request = SimpleNamespace(headers={LEASE_HEADER: ran.to_header()})
    beat_leases._on_prerun(task_id="t1", task=SimpleNamespace(app=app, request=request))
    assert leases.lease_holder("periodic-task-1") == "beat-a:1"
    beat_leases._on_postrun(task_id="t1", task=SimpleNamespace(app=app, request=request))
    assert leases.lease_holder("periodic-task-1") is None

    # an expired trigger never runs: the worker's Request object is revoked instead
    expired = _admit(leases, "periodic-task-2", "beat-b:7", 2_000_000)
    worker_request = SimpleNamespace(id="t2", request_dict={LEASE_HEADER: expired.to_header()})
    beat_leases._on_revoked(sender=SimpleNamespace(app=app), request=worker_request)
    assert leases.lease_holder("periodic-task-2") is None

    # a stale header never releases a lease another admission holds now
    current = _admit(leases, "periodic-task-3", "beat-c:2", 3_000_000)
    stale = SimpleNamespace(headers={LEASE_HEADER: dict(current.to_header(), token="old")})
    beat_leases._on_postrun(task_id="t3", task=SimpleNamespace(app=app, request=stale))
    assert leases.lease_holder("periodic-task-3") == "beat-c:2"


def test_a_task_without_the_header_is_left_alone() -> None:
    plain = SimpleNamespace(headers={"other": 1})
    assert LeaseGrant.from_request(plain) is None
    broken = SimpleNamespace(headers={LEASE_HEADER: {"job": "x"}})
    assert LeaseGrant.from_request(broken) is None
