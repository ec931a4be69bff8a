"""A 10,000-child batch against the same 10,000 plain jobs, and Celery's chord, one run.

Run: .venv/bin/python bench/batches.py [--children 10000] [--rounds 3] [--no-chord]
     [--shards 32] [--statements]

Two ``celery worker -P prefork -c 2`` processes of ``tests.apps.batch_app`` (the app of
the batch tests) consume. Per round, in ABBA order (the machine's load moves a lot
between runs: compare the per-round ratios and their median):

- plain: the children published with ``publish(..., tx=conn)`` in one transaction; the
  time from its ``COMMIT`` until every child's row is in ``public.batch_effects``;
- batch: the same children in ``port.batch(on_complete=..., tx=conn)``; the time from its
  ``COMMIT`` until the ``on_complete`` callback ran (so it includes the last shard's
  check and the callback's own relay and run).

The end is polled every 50 ms on one connection (before 2026-12-07 11:45 UTC: a new
connection per poll, whose backend start-ups PostgreSQL's CPU counted too). While each
runs, ``pg_stat_activity`` is sampled every 20 ms: samples of backends waiting on a lock
(``wait_event_type`` ``Lock`` or ``LWLock``) are counted, by wait event; and the CPU
seconds the workers (every process of both, the relay threads included) and PostgreSQL
(every backend) used from the ``COMMIT`` to the end are read from ``/proc``: on a shared
machine the wall time follows everyone else's load, the CPU per child less so, and it
says on which side a difference lies. ``--statements`` loads ``pg_stat_statements`` and
prints, per run, the statements that took the most time in PostgreSQL. Then Celery's
``chord`` of the same number of tasks, on the same Redis as broker and result backend,
with two workers of ``bench/chord_app.py``: its time and whether the callback ran
within 600 s.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import redis

from bench._cpu import postmaster_pid, tree_cpu_seconds
from bench._servers import bench_postgres, bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.batches import Callback
from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.batch_app import CALLBACK, CHILD, QUEUE, TABLES_SQL

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")


def child() -> dict[str, Any]:
    return {"tenant_id": "t1", "kind": CHILD, "data": {}}


class Poll:
    """Counts rows on one autocommit connection, every 50 ms until a condition holds: a
    connection per poll would have PostgreSQL start a backend 20 times a second, CPU the
    measured run pays for in proportion to its length."""

    def __init__(self, db_url: str) -> None:
        self.conn = psycopg2.connect(db_url)
        self.conn.autocommit = True

    def count(self, sql: str) -> int:
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])

    def until(self, sql: str, at_least: int) -> None:
        wait_until(lambda: self.count(sql) >= at_least, timeout=900, interval=0.05)

    def close(self) -> None:
        self.conn.close()


def count(db_url: str, sql: str) -> int:
    conn = psycopg2.connect(db_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


class LockSampler:
    """Samples pg_stat_activity for backends waiting on locks until stopped: heavyweight
    locks (rows, transactions) and lightweight ones (a buffer's content lock is where
    updates of rows on one hot page would queue, which no row lock shows)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.samples = 0
        self.waiting: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = psycopg2.connect(self.db_url)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self._stop.wait(0.02):
                cur.execute(
                    "SELECT wait_event_type || ':' || wait_event, count(*) "
                    "FROM pg_stat_activity WHERE wait_event_type IN ('Lock', 'LWLock') "
                    "GROUP BY 1"
                )
                self.samples += 1
                for event, n in cur.fetchall():
                    self.waiting[event] += n
        conn.close()

    def describe(self) -> str:
        total = sum(self.waiting.values())
        detail = ", ".join(f"{k}: {v}" for k, v in self.waiting.most_common()) or "none"
        return f"{total} backend-samples waiting on a lock in {self.samples} samples ({detail})"


class Measured:
    """From the ``COMMIT`` to the end of a run: wall time, lock waits, CPU per side, and
    (with ``--statements``) PostgreSQL's busiest statements."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.sampler = LockSampler(db_url)
        self.elapsed = 0.0
        self.worker_cpu = 0.0
        self.postgres_cpu = 0.0
        self.statements: list[tuple[int, int, float, float, str]] = []

    def __enter__(self) -> Measured:
        if STATEMENTS:
            run_sql(self.db_url, "SELECT pg_stat_statements_reset()")
        self._cpu = (tree_cpu_seconds(WORKER_PIDS), tree_cpu_seconds([POSTMASTER]))
        self._start = time.perf_counter()
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self._start
        self.worker_cpu = tree_cpu_seconds(WORKER_PIDS) - self._cpu[0]
        self.postgres_cpu = tree_cpu_seconds([POSTMASTER]) - self._cpu[1]
        self.sampler.__exit__(*exc)
        if STATEMENTS:
            self.statements = top_statements(self.db_url)

    def describe(self, n: int) -> str:
        lines = [
            f"{self.sampler.describe()}; CPU from the COMMIT: workers {self.worker_cpu:.1f} s "
            f"({self.worker_cpu / n * 1000:.3f} ms/child), PostgreSQL {self.postgres_cpu:.1f} s "
            f"({self.postgres_cpu / n * 1000:.3f} ms/child)"
        ]
        for calls, plans, total, mean, query in self.statements:
            lines.append(
                f"    {total:8.0f} ms {calls:7d} calls {plans:7d} plans {mean:7.3f} ms  {query}"
            )
        return "\n".join(lines)


def run_sql(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(db_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def top_statements(db_url: str) -> list[tuple[int, int, float, float, str]]:
    """The statements PostgreSQL spent the most time on (planning included: ``plans``
    counts how often each was planned)."""
    rows = run_sql(
        db_url,
        "SELECT calls, plans, total_exec_time + total_plan_time, "
        "(total_exec_time + total_plan_time) / calls, "
        "regexp_replace(left(query, 400), '\\s+', ' ', 'g') FROM pg_stat_statements "
        "WHERE query NOT LIKE '%pg_stat%' ORDER BY 2 DESC LIMIT 12",
    )
    return [(int(c), int(p), float(t), float(m), str(q)[:150]) for c, p, t, m, q in rows]


def run_plain(port: QueuePort, db_url: str, n: int) -> Measured:
    conn = psycopg2.connect(db_url)
    with conn:
        for _ in range(n):
            port.publish(QUEUE, child(), tx=conn)
    poll = Poll(db_url)
    with Measured(db_url) as measured:
        poll.until("SELECT count(*) FROM public.batch_effects", n)
    poll.close()
    conn.close()
    return measured


SHARDS = 32
"""``--shards``: the batch's shard count (1 makes the one hot row the shards avoid)."""


STATEMENTS = False
"""``--statements``: PostgreSQL runs with ``pg_stat_statements``, printed per run."""
WORKER_PIDS: list[int] = []
POSTMASTER = 0


def run_batch(port: QueuePort, db_url: str, n: int) -> Measured:
    conn = psycopg2.connect(db_url)
    with (
        conn,
        port.batch(
            on_complete=Callback(QUEUE, CALLBACK, "t1", {"name": "complete"}),
            shards=SHARDS,
            tx=conn,
        ) as batch,
    ):
        for _ in range(n):
            batch.publish(QUEUE, child())
    poll = Poll(db_url)
    with Measured(db_url) as measured:
        poll.until("SELECT count(*) FROM public.batch_callbacks", 1)
    poll.close()
    conn.close()
    assert count(db_url, "SELECT count(*) FROM public.batch_effects") == n
    return measured


def start_workers(
    env: dict[str, str], app: str, tmp: Path, name: str
) -> list[subprocess.Popen[bytes]]:
    workers = []
    for i in range(2):
        log = open(tmp / f"{name}-{i}.log", "wb")  # noqa: SIM115
        argv = [
            CELERY,
            "-A",
            app,
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-n",
            f"{name}{i}@%h",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ]
        workers.append(
            subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        )
    return workers


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def chord(redis_url: str, n: int, tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    env.update(BENCH_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    os.environ["BENCH_REDIS_URL"] = redis_url
    from celery import chord as make_chord

    from bench import chord_app

    workers = start_workers(env, "bench.chord_app", tmp, "chord")
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(  # both workers answer before the clock starts
            lambda: len(chord_app.app.control.ping(timeout=0.5)) >= len(workers),
            timeout=120,
            message="chord workers answering",
        )
        start = time.time()
        make_chord(chord_app.child.s(i) for i in range(n))(chord_app.done.s())
        published = time.time() - start
        try:
            wait_until(
                lambda: client.get("bench:chord:done") is not None, timeout=600, interval=0.05
            )
            raw = client.get("bench:chord:done")
            assert isinstance(raw, bytes)
            stamp, size = raw.decode().split()
            print(
                f"[chord] {n} tasks: completed in {float(stamp) - start:.1f} s "
                f"(publishing {published:.1f} s), callback got {size} results"
            )
        except TimeoutError:
            print(f"[chord] {n} tasks: callback did not run within 600 s")
    finally:
        stop(workers)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-chord", action="store_true")
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()
    global SHARDS, STATEMENTS, POSTMASTER
    SHARDS = args.shards
    STATEMENTS = args.statements
    tmp = Path(tempfile.mkdtemp())
    options = (
        {
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track_planning": "on",
        }
        if STATEMENTS
        else None
    )
    with bench_redis() as server, bench_postgres(options) as pg:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        with conn, conn.cursor() as cur:
            cur.execute(TABLES_SQL)
            if STATEMENTS:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.close()
        POSTMASTER = postmaster_pid(pg.data_dir)
        settings = PlatformSettings.build(
            redis_url=server.url, database_url=pg.url, profile="bench"
        )
        app = create_app("bench_batches_producer", settings=settings)
        port = QueuePort(app)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
        env.update(
            PLATFORM_REDIS_URL=server.url,
            PLATFORM_DATABASE_URL=pg.url,
            PLATFORM_PROFILE="bench",
            PYTHONPATH=str(ROOT),
        )
        workers = start_workers(env, "tests.apps.batch_app", tmp, "w")
        WORKER_PIDS[:] = [worker.pid for worker in workers]
        try:
            warm = [port.publish(QUEUE, child(), tx=None) for _ in range(50)]
            wait_until(
                lambda: count(pg.url, "SELECT count(*) FROM public.batch_effects") >= len(warm),
                timeout=120,
            )
            ratios = []
            cpu_ratios = []
            for r in range(args.rounds):
                results = {}
                cpu: dict[str, float] = {}
                order = (("plain", run_plain), ("batch", run_batch))
                for kind, run in order if r % 2 == 0 else order[::-1]:  # ABBA
                    reset = psycopg2.connect(pg.url)
                    with reset, reset.cursor() as cur:
                        cur.execute("TRUNCATE public.batch_effects, public.batch_callbacks")
                    reset.close()
                    measured = run(port, pg.url, args.children)
                    elapsed = measured.elapsed
                    results[kind] = elapsed
                    cpu[kind] = measured.worker_cpu + measured.postgres_cpu
                    print(
                        f"[round {r + 1}] {kind}: {args.children} children in {elapsed:.1f} s "
                        f"({args.children / elapsed:.0f}/s); {measured.describe(args.children)}",
                        flush=True,
                    )
                ratios.append(results["batch"] / results["plain"])
                cpu_ratios.append(cpu["batch"] / cpu["plain"])
                print(
                    f"[round {r + 1}] batch / plain = {ratios[-1]:.3f} "
                    f"(CPU, workers + PostgreSQL: {cpu_ratios[-1]:.3f})",
                    flush=True,
                )
            print(f"[all] batch / plain: median {statistics.median(ratios):.3f} of {ratios}")
            print(
                "[all] CPU batch / plain: median "
                f"{statistics.median(cpu_ratios):.3f} of {cpu_ratios}"
            )
        finally:
            stop(workers)
            port.close()
        if not args.no_chord:
            chord(server.url, args.children, tmp)


if __name__ == "__main__":
    main()
