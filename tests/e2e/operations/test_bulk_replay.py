"""Bulk replay by filter end to end: the real CLI, real PostgreSQL and Redis, real workers.

Two replays of the same filter race over 10,000 rows while two workers apply the jobs:
each row is replayed by exactly one of them, each job is applied once. A replay killed
in the middle is continued by rerunning the same command.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks.operations.bulk_run import LOCK_CLASS
from platform_tasks.testing.servers import wait_until
from tests.support.operations import (
    APP,
    REPO_ROOT,
    Shell,
    add_dead_letters,
    create_applied_table,
    json_out,
)
from tests.support.processes import CeleryProcess, celery_processes, worker_argv

GATE_KEY = 4242
GATE_SQL = f"""
CREATE OR REPLACE FUNCTION public.ops_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.done >= 500 AND OLD.done < 500 THEN
        PERFORM pg_advisory_xact_lock_shared({GATE_KEY});
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS ops_test_gate ON core.operations;
CREATE TRIGGER ops_test_gate BEFORE UPDATE ON core.operations
    FOR EACH ROW EXECUTE FUNCTION public.ops_test_gate();
"""


@pytest.fixture
def shell(redis_url: str, database_url: str) -> Shell:
    create_applied_table(database_url)
    return Shell(redis_url, database_url)


def _start_workers(
    shell: Shell, started: list[CeleryProcess], tmp_path: Path, n: int = 2
) -> list[CeleryProcess]:
    workers = []
    for index in range(n):
        worker = CeleryProcess(
            worker_argv(APP, concurrency=2, hostname=f"w{index}@%h"),
            env=shell.env,
            cwd=REPO_ROOT,
            log_path=tmp_path / f"worker{index}.log",
        ).start()
        started.append(worker)
        workers.append(worker)
    for worker in workers:
        worker.wait_for_log("ready.", timeout=120)
    return workers


def test_two_concurrent_bulk_replays_of_10000_rows_replay_and_apply_each_once(
    shell: Shell, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job_ids = set(add_dead_letters(shell.database_url, 10_000, tenant="acme"))
    add_dead_letters(shell.database_url, 50, tenant="other")  # outside the filter
    with celery_processes() as started:
        _start_workers(shell, started, tmp_path)
        # Hold both replays at their first batch until both wait, then let them race.
        gate = psycopg2.connect(shell.database_url)
        try:
            with gate.cursor() as cur:
                cur.execute("LOCK TABLE core.dead_letters IN EXCLUSIVE MODE")
                procs = [
                    shell.popen("dead-letters", "replay", "--tenant", "acme", "--yes", "--json")
                    for _ in range(2)
                ]

                def both_waiting() -> bool:
                    cur.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted "
                        "AND relation = 'core.dead_letters'::regclass"
                    )
                    row = cur.fetchone()
                    return bool(row and row[0] == 2)

                wait_until(both_waiting, timeout=120, message="both replays to wait")
            gate.commit()
            # both outputs read at once: a full pipe would stall one replay behind the other
            with ThreadPoolExecutor(2) as pool:
                outputs = list(pool.map(lambda proc: proc.communicate(timeout=600), procs))
        finally:
            gate.close()
        reports = []
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert proc.returncode in (0, 1), err[-3000:]
            reports.append(json_out(out, err))

        replayed = [row["id"] for report in reports for row in report["replayed"]]
        assert len(replayed) == 10_000 == len(set(replayed))
        operations = {report["operation"]["id"] for report in reports}
        assert len(operations) == 2  # two operations, each logged with its own counts
        assert sum(report["operation"]["done"] for report in reports) == 10_000
        print("rows per operation:", [report["operation"]["done"] for report in reports])
        assert all(report["operation"]["actor"] == "tester" for report in reports)

        def applied() -> int:
            return int(shell.scalar("SELECT count(*) FROM public.ops_applied"))

        wait_until(
            lambda: applied() >= 10_000,
            timeout=600,
            interval=0.5,
            message="the workers to apply the 10,000 replayed jobs",
        )
        wait_until(
            lambda: redis_client.llen("default") == 0, timeout=60, message="the queue to be empty"
        )
    # workers stopped (warm): whatever they had taken is settled
    rows = shell.query("SELECT job_id::text, count(*) FROM public.ops_applied GROUP BY 1")
    assert {job for job, _ in rows} == job_ids
    assert max(count for _, count in rows) == 1
    statuses = shell.query(
        "SELECT tenant_id, status, replay_count, count(*) FROM core.dead_letters GROUP BY 1, 2, 3"
    )
    assert sorted(statuses) == [("acme", "replayed", 1, 10_000), ("other", "pending_review", 0, 50)]


def test_killed_bulk_replay_is_continued_by_rerunning_it(
    shell: Shell, redis_client: redis.Redis
) -> None:
    job_ids = add_dead_letters(shell.database_url, 2_000, tenant="acme", error_type="Timeout")
    add_dead_letters(shell.database_url, 10, tenant="acme", error_type="Other")
    args = (
        "dead-letters",
        "replay",
        "--tenant",
        "acme",
        "--error-type",
        "Timeout",
        "--batch-size",
        "100",
        "--yes",
        "--json",
    )
    # A gate inside the batch that brings the operation to 500 rows: its progress update
    # waits on an advisory lock this test holds, after the batch's publishes.
    holder = psycopg2.connect(shell.database_url)
    holder.autocommit = True
    try:
        with holder.cursor() as cur:
            cur.execute(GATE_SQL)
            cur.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
            proc = shell.popen(*args)

            def blocked() -> bool:
                cur.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND NOT granted AND objid = %s",
                    (GATE_KEY,),
                )
                row = cur.fetchone()
                return bool(row and row[0] == 1)

            wait_until(blocked, timeout=120, message="the replay to wait inside a batch")
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            cur.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
            operation_id = shell.scalar("SELECT id FROM core.operations WHERE kind = 'replay'")
    finally:
        with holder.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS ops_test_gate ON core.operations")
        holder.close()

    def released() -> bool:  # the killed session's backend is gone with its lock
        return not shell.query(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = %s", (LOCK_CLASS,)
        )

    wait_until(released, timeout=60, message="the killed replay's session to end")
    crashed = shell.query(
        "SELECT outcome, done FROM core.operations WHERE id = %s", (operation_id,)
    )[0]
    assert crashed == ("running", 400)  # four batches committed, the fifth rolled back

    rerun = shell.run(*args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json_out(rerun.stdout, rerun.stderr)
    assert report["resumed"] is True
    assert report["operation"]["id"] == operation_id
    assert report["operation"]["outcome"] == "succeeded"
    assert report["operation"]["done"] == 2_000
    assert report["operation"]["matched"] == 2_000
    assert shell.scalar("SELECT count(*) FROM core.operations") == 1
    rows = shell.query(
        "SELECT error_type, status, replay_count, count(*) FROM core.dead_letters GROUP BY 1, 2, 3"
    )
    assert sorted(rows) == [("Other", "pending_review", 0, 10), ("Timeout", "replayed", 1, 2_000)]
    # the batch in flight at the kill was published and rolled back, so it is published
    # again: every job is on the broker, a few twice (the consumer's idempotency row
    # applies each once)
    import json as _json

    on_broker = [_json.loads(raw)["headers"]["id"] for raw in redis_client.lrange("default", 0, -1)]
    assert set(on_broker) == set(job_ids)
    assert len(on_broker) - len(job_ids) <= 100
