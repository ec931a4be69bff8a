"""Cancel by tenant end to end: queued and delayed jobs of the tenant never run, each one
gets its accounting row; other tenants' jobs and jobs published after the cancel run; the
tenant's dead letters replayed while the cancel is in force run (the incident sequence:
cancel, fix the cause, replay); a running job sees ``is_cancelled()``. Real CLI,
PostgreSQL, Redis broker and workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from platform_tasks.app import platform_queue_port
from platform_tasks.keys import delay_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.operations import (
    APP,
    REPO_ROOT,
    Shell,
    add_dead_letters,
    create_applied_table,
    envelope,
)
from tests.support.processes import CeleryProcess, celery_processes, worker_argv

UNIQUE = {"unique_key": "sync:gone", "unique_for": timedelta(hours=1)}


@pytest.fixture
def shell(redis_url: str, database_url: str) -> Shell:
    create_applied_table(database_url)
    return Shell(redis_url, database_url)


def _workers(shell: Shell, started: list[CeleryProcess], tmp_path: Path) -> None:
    workers = [
        CeleryProcess(
            worker_argv(APP, concurrency=2, hostname=f"w{index}@%h"),
            env=shell.env,
            cwd=REPO_ROOT,
            log_path=tmp_path / f"worker{index}.log",
        ).start()
        for index in range(2)
    ]
    started.extend(workers)
    for worker in workers:
        worker.wait_for_log("ready.", timeout=120)


def test_cancel_by_tenant_stops_queued_and_delayed_jobs_and_accounts_for_each(
    shell: Shell, settings: PlatformSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    failed_before = add_dead_letters(shell.database_url, 5, tenant="gone")  # before the cancel
    port = platform_queue_port(settings)
    # an hour away, so a slow publish loop cannot make one due before the cancel; made due
    # below by rewriting the scores, the way time passing would
    later_on = datetime.now(UTC) + timedelta(hours=1)
    try:
        gone = [str(port.publish("default", envelope("gone"))) for _ in range(30)]
        gone += [str(port.schedule("default", envelope("gone"), later_on)) for _ in range(20)]
        stay = [str(port.publish("default", envelope("stay"))) for _ in range(30)]
        stay += [str(port.schedule("default", envelope("stay"), later_on)) for _ in range(10)]
        # a unique job the cancel stops must free its key (else held for unique_for)
        gone.append(str(port.publish("default", envelope("gone"), **UNIQUE)))
    finally:
        port.close()
    assert redis_client.llen("default") == 61

    preview = shell.run("jobs", "cancel", "--tenant", "gone", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert "20 delayed job(s) match tenant_id=gone" in preview.stdout
    result = shell.run("jobs", "cancel", "--tenant", "gone", "--yes")
    assert result.returncode == 0, result.stderr
    assert "cancelled 20 delayed job(s)" in result.stdout
    operation_id = shell.scalar("SELECT id FROM core.operations WHERE kind = 'cancel'")
    schedule = delay_keys("test").schedule
    waiting = redis_client.zrange(schedule, 0, -1)
    assert len(waiting) == 10  # the other tenant's delayed jobs
    redis_client.zadd(schedule, dict.fromkeys(waiting, 0))

    with celery_processes() as started:
        _workers(shell, started, tmp_path)
        later = str(platform_queue_port(settings).publish("default", envelope("gone")))

        def settled() -> bool:
            applied = shell.scalar("SELECT count(*) FROM public.ops_applied")
            cancelled = shell.scalar(
                "SELECT count(*) FROM core.dead_letters WHERE reason = 'cancelled'"
            )
            return bool(applied == 41 and cancelled == 51)

        wait_until(
            settled,
            timeout=180,
            interval=0.25,
            message="the other tenant's jobs to run and the cancelled ones to be counted",
        )
        wait_until(lambda: redis_client.llen("default") == 0, timeout=60, message="an empty queue")
        applied = shell.query("SELECT job_id::text, tenant_id FROM public.ops_applied")
        assert sorted(job for job, _ in applied) == sorted([*stay, later])
        parked = platform_queue_port(settings)  # a queue no worker consumes: it stays put
        try:
            again = str(parked.publish("parked", envelope("gone"), **UNIQUE))
        finally:
            parked.close()
        assert again != gone[-1]  # a new job: the cancelled one's key was freed

        # the cause is fixed: the tenant's dead letters are replayed while the rule holds
        replay = shell.run("dead-letters", "replay", "--tenant", "gone", "--yes")
        assert replay.returncode == 0, replay.stderr
        wait_until(
            lambda: shell.scalar("SELECT count(*) FROM public.ops_applied") == 46,
            timeout=120,
            interval=0.25,
            message="the replayed dead letters to run",
        )
    applied = shell.query("SELECT job_id::text, tenant_id FROM public.ops_applied")
    assert sorted(job for job, _ in applied) == sorted([*stay, later, *failed_before])
    rows = shell.query(
        "SELECT job_id::text, status, discard_reason, tenant_id FROM core.dead_letters "
        "WHERE reason = 'cancelled'"
    )
    assert sorted(job for job, *_ in rows) == sorted(gone)  # one row per cancelled job
    assert {tuple(rest) for _, *rest in rows} == {
        ("discarded", f"cancelled by operation {operation_id}", "gone")
    }
    logged = shell.query(
        "SELECT actor, outcome, done, filter->>'tenant_id' FROM core.operations "
        "WHERE kind = 'cancel'"
    )
    assert logged == [("tester", "succeeded", 51, "gone")]
    listed = shell.run("operations", "list")
    assert listed.returncode == 0 and "cancel" in listed.stdout and "tester" in listed.stdout
    assert redis_client.zcard(schedule) == 0

    rules = shell.run("jobs", "cancel", "--rules")
    assert rules.returncode == 0, rules.stderr
    assert f"operation {operation_id}: tenant_id=gone published up to" in rules.stdout
    lifted = shell.run("jobs", "cancel", "--lift", str(operation_id))
    assert lifted.returncode == 0 and f"lifted the cancel rule of operation {operation_id}" in (
        lifted.stdout
    )
    assert shell.run("jobs", "cancel", "--rules").stdout.strip() == ""
    again = shell.run("jobs", "cancel", "--lift", str(operation_id))
    assert again.returncode == 1 and "no cancel rule of operation" in again.stderr


def test_running_job_sees_the_cancel_flag(
    shell: Shell, settings: PlatformSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    with celery_processes() as started:
        _workers(shell, started, tmp_path)
        port = platform_queue_port(settings)
        try:
            job = str(port.publish("default", envelope("long", kind="tests.ops.wait_cancel")))
        finally:
            port.close()
        wait_until(
            lambda: redis_client.get(f"test:started:{job}") is not None,
            timeout=60,
            message="the long job to start",
        )
        assert redis_client.get(f"test:outcome:{job}") is None
        result = shell.run("jobs", "cancel", "--tenant", "long", "--yes")
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: redis_client.get(f"test:outcome:{job}") is not None,
            timeout=30,
            message="the job to stop",
        )
        assert redis_client.get(f"test:outcome:{job}") == b"cancelled"
