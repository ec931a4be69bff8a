"""Batches through real workers (started as the README says) on Redis and PostgreSQL.

One run of two workers covers the issue's scenarios in turn: a batch whose children
partly fail for good, with duplicates delivered on purpose and a worker SIGKILLed twice
(``on_complete`` once, after the last child ended; ``on_death`` once; ``on_success``
never); the replay of its dead letters (``on_success`` exactly once); a child cancelled
by ``jobs cancel`` (counted, the batch completes); a child adding 100 children to its
batch (no completion before they end); the last two children of a batch ending at the
same moment in two processes (one callback). The first batch has 10,000 children;
``BATCH_CHILDREN`` sets another size (a smaller one for a quick local run).
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2

from platform_tasks import QueuePort
from platform_tasks.envelope import uuid7
from platform_tasks.headers import BATCH_HEADER
from platform_tasks.operations import cancel_jobs
from platform_tasks.operations.filters import JobFilter
from platform_tasks.settings import PlatformSettings
from tests.apps.batch_app import QUEUE, TABLES_SQL
from tests.conftest import REPO_ROOT
from tests.e2e.batches.batching import (
    assert_completed_once,
    cb,
    child,
    fired,
    fix_and_replay,
    last_effect,
    names,
    publish_batch,
)
from tests.e2e.publishing.outbox import producer, wait_for
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

CHILDREN = int(os.environ.get("BATCH_CHILDREN", "10000"))
FAILING_EVERY = 20  # 5 % of the children fail for good
DUPLICATES = 50
KILLS = 2


def start_worker(
    started: list[CeleryProcess], redis_url: str, database_url: str, log: Path, name: str
) -> CeleryProcess:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
        },
    )
    worker = CeleryProcess(
        worker_argv("tests.apps.batch_app", concurrency=2, hostname=f"{name}@%h"),
        env=env,
        cwd=REPO_ROOT,
        log_path=log,
    ).start()
    started.append(worker)
    worker.wait_for_log("ready.", timeout=60)
    return worker


def last_two_at_once(
    port: QueuePort, database_url: str, worker: CeleryProcess
) -> tuple[uuid.UUID, list[int]]:
    """Two children, one per shard, due in two seconds; the test holds the batch's row lock
    until both wait on it (each brought its shard to zero), then lets them go at once.
    The batch and the processes that applied the two children."""
    picked: dict[int, str] = {}
    while len(picked) < 2:
        job = str(uuid7())
        shard = query(database_url, "SELECT ((hashtext(%s) %% 2) + 2) %% 2", job)[0][0]
        picked.setdefault(int(shard), job)
    due = datetime.now(UTC) + timedelta(seconds=2)  # the lock is taken well before
    conn = psycopg2.connect(database_url)
    with (
        conn,
        conn.cursor() as cur,
        port.batch(on_complete=cb("complete"), on_success=cb("success"), shards=2, tx=cur) as b,
    ):
        for job in picked.values():
            b.schedule(QUEUE, {**child(), "job_id": job}, due)
    holder = conn
    hold = holder.cursor()
    hold.execute("SELECT 1 FROM core.batches WHERE batch_id = %s FOR UPDATE", (str(b.id),))
    waiting = (
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        "WHERE NOT l.granted AND a.query LIKE '%%core.batches%%'"
    )
    wait_for(
        lambda: query(database_url, waiting)[0][0] >= 2,
        timeout=30,
        message="both last children wait on the batch",
        worker=worker,
    )
    assert names(database_url, b.id) == []
    holder.commit()
    holder.close()
    wait_for(
        lambda: len(names(database_url, b.id)) >= 2,
        timeout=30,
        message="the pair's callbacks ran",
        worker=worker,
    )
    pids = [
        int(p)
        for (p,) in query(
            database_url,
            "SELECT pid FROM public.batch_effects WHERE job_id = ANY(%s::uuid[])",
            list(picked.values()),
        )
    ]
    return b.id, pids


def test_batches_through_workers_sigkills_duplicates_replay_cancel_and_growth(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    query(database_url, "DROP TABLE IF EXISTS public.batch_effects")
    query(database_url, TABLES_SQL)
    query(database_url, "TRUNCATE public.batch_effects, public.batch_fixed, public.batch_callbacks")
    payloads = [child(fail=n % FAILING_EVERY == 0) for n in range(CHILDREN)]
    with celery_processes() as started, producer(redis_url, redis_url, database_url) as port:
        batch, jobs = publish_batch(port, database_url, payloads)
        failing = [job for job, p in zip(jobs, payloads, strict=True) if p["data"]["fail"]]
        # duplicates on purpose: copies of children, same id, data and batch
        for job, payload in list(zip(jobs, payloads, strict=True))[1 : DUPLICATES + 1]:
            port.publish(
                QUEUE,
                {**payload, "job_id": str(job)},
                {"headers": {BATCH_HEADER: str(batch)}},
                tx=None,
            )
        one = start_worker(started, redis_url, database_url, tmp_path / "w1.log", "w1")
        two = start_worker(started, redis_url, database_url, tmp_path / "w2.log", "w2")

        def effects():
            return int(query(database_url, "SELECT count(*) FROM public.batch_effects")[0][0])

        workers = [one, two]
        for kill in range(KILLS):  # SIGKILL a worker mid-run (w2, then w1), start it again
            target = (kill + 1) * CHILDREN // (KILLS + 2)
            victim = workers[1 - kill]
            wait_for(
                lambda t=target: effects() >= t, timeout=120, message="progress", worker=victim
            )
            victim.kill_group()
            name = f"w{2 - kill}"
            workers[1 - kill] = start_worker(
                started, redis_url, database_url, tmp_path / f"{name}-{kill}.log", name
            )
        one, two = workers
        wait_for(
            lambda: "complete" in names(database_url, batch),
            timeout=180,
            message="on_complete ran",
            worker=one,
        )
        settled_jobs = query(
            database_url,
            "SELECT count(*) FROM core.batch_jobs WHERE batch_id = %s AND outcome IS NOT NULL",
            str(batch),
        )[0][0]
        assert settled_jobs == CHILDREN
        dead = query(
            database_url,
            "SELECT count(*) FROM core.dead_letters WHERE job_id = ANY(%s::uuid[])",
            [str(j) for j in failing],
        )[0][0]
        outcomes = query(
            database_url,
            "SELECT bj.outcome, d.reason, d.status, count(*) FROM core.batch_jobs bj "
            "LEFT JOIN core.dead_letters d ON d.job_id = bj.job_id "
            "WHERE bj.job_id = ANY(%s::uuid[]) GROUP BY 1, 2, 3",
            [str(j) for j in failing],
        )
        assert dead == len(failing), outcomes
        assert_completed_once(database_url, batch, jobs, failing)

        # -- fix the failing children, replay their dead letters: on_success once
        fix_and_replay(port, database_url, failing)
        wait_for(
            lambda: "success" in names(database_url, batch),
            timeout=90,
            message="on_success ran after the replay",
            worker=one,
        )

        # -- a child cancelled by jobs cancel (waiting in the delay store): counted
        due = datetime.now(UTC) + timedelta(hours=1)
        cancelled_batch, _cancel_jobs_ids = publish_batch(
            port, database_url, [child(), child("t-later")], due=due
        )
        settings = PlatformSettings.build(
            redis_url=redis_url, broker_url=redis_url, database_url=database_url, profile="test"
        )
        cancel_jobs(settings, JobFilter(tenant_id="t-later"))
        wait_for(
            lambda: "complete" in names(database_url, cancelled_batch),
            timeout=60,
            message="the batch with a cancelled child completed",
            worker=one,
        )

        # -- the last two children end at the same moment in two processes: one callback
        pair, pids = last_two_at_once(port, database_url, one)

        # -- a child adds 100 children to its own batch: no completion before they end
        grown, (parent,) = publish_batch(port, database_url, [child(add=100)])
        wait_for(
            lambda: "complete" in names(database_url, grown),
            timeout=90,
            message="the grown batch completed",
            worker=one,
        )
        added = [
            uuid.UUID(str(j))
            for (j,) in query(
                database_url,
                "SELECT job_id FROM core.batch_jobs WHERE batch_id = %s AND job_id <> %s",
                str(grown),
                str(parent),
            )
        ]
        grown_calls = fired(database_url, grown)
        one.stop()
        two.stop()

    assert sorted(names(database_url, batch)) == ["complete", "death", "success"], "each once"
    success = next(c for c in fired(database_url, batch) if c[0] == "success")
    assert success[1]["applied"] == CHILDREN
    cancelled_calls = fired(database_url, cancelled_batch)
    assert [name for name, _, _ in cancelled_calls] == ["complete"]
    assert cancelled_calls[0][1]["cancelled"] == 1 and cancelled_calls[0][1]["applied"] == 1
    assert names(database_url, pair) == ["complete", "success"] or names(database_url, pair) == [
        "success",
        "complete",
    ]
    assert len(set(pids)) == 2, "the two children ran in two processes"
    assert len(added) == 100
    assert [name for name, _, _ in grown_calls] in (
        ["complete", "success"],
        ["success", "complete"],
    )
    assert grown_calls[0][1]["total"] == 101
    assert min(ran for _, _, ran in grown_calls) > last_effect(database_url, added)
