"""Where a worker's CPU goes for batch children against the same plain jobs (cProfile).

Run: .venv/bin/python bench/batch_worker_profile.py [--children 3000] [--top 25]
     [--no-profile --repeat 3]

For each kind (plain, then batch) the children are published in one transaction first,
then one ``celery worker -P solo`` of ``tests.apps.batch_app`` runs under cProfile until
they were all applied (the batch: until its ``on_complete`` ran) and is stopped. The solo
pool runs the handlers in the profiled main thread (the outbox relay runs in a thread of
its own and is not in the profile: it is the same for both kinds). Printed: the worker's
CPU seconds, the profile's total per child, and the functions whose cumulative time per
child differs most between the two kinds. ``--no-profile`` runs the workers without the
profiler and only prints their CPU (start-up included, the same for both kinds);
``--repeat`` alternates the two kinds that many times on the same database.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench._cpu import tree_cpu_seconds
from bench._servers import bench_postgres, bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.batches import Callback
from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.batch_app import CALLBACK, CHILD, QUEUE, TABLES_SQL

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")


def count(db_url: str, sql: str) -> int:
    conn = psycopg2.connect(db_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def publish(kind: str, port: QueuePort, db_url: str, n: int) -> None:
    child: dict[str, Any] = {"tenant_id": "t1", "kind": CHILD, "data": {}}
    conn = psycopg2.connect(db_url)
    with conn:
        if kind == "plain":
            for _ in range(n):
                port.publish(QUEUE, child, tx=conn)
        else:
            on_complete = Callback(QUEUE, CALLBACK, "t1", {"name": "complete"})
            with port.batch(on_complete=on_complete, tx=conn) as batch:
                for _ in range(n):
                    batch.publish(QUEUE, child)
    conn.close()


def profile(kind: str, env: dict[str, str], db_url: str, n: int, out: Path | None) -> float:
    profiler = [] if out is None else ["-m", "cProfile", "-o", str(out)]
    argv = [
        sys.executable,
        *profiler,
        CELERY,
        "-A",
        "tests.apps.batch_app",
        "worker",
        "-P",
        "solo",
        "-n",
        f"profile-{kind}@%h",
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "WARNING",
    ]
    worker = subprocess.Popen(argv, env=env, cwd=ROOT)
    done = (
        "SELECT count(*) FROM public.batch_effects"
        if kind == "plain"
        else f"SELECT count(*) * {n} FROM public.batch_callbacks"
    )
    try:
        wait_until(lambda: count(db_url, done) >= n, timeout=900, interval=0.1)
        cpu = tree_cpu_seconds([worker.pid])
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return cpu


def cumulative(path: Path) -> tuple[float, dict[str, float]]:
    stats: Any = pstats.Stats(str(path))
    per_function: dict[str, float] = {}
    for (file, line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        key = f"{Path(file).name}:{line}({name})"
        per_function[key] = per_function.get(key, 0.0) + ct
    return float(stats.total_tt), per_function


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    n = args.children
    tmp = Path(tempfile.mkdtemp(prefix="batch-profile-"))
    with bench_redis() as server, bench_postgres() as pg:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        with conn, conn.cursor() as cur:
            cur.execute(TABLES_SQL)
        conn.close()
        settings = PlatformSettings.build(
            redis_url=server.url, database_url=pg.url, profile="bench"
        )
        port = QueuePort(create_app("bench_batch_profile_producer", settings=settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
        env.update(
            PLATFORM_REDIS_URL=server.url,
            PLATFORM_DATABASE_URL=pg.url,
            PLATFORM_PROFILE="bench",
            PYTHONPATH=str(ROOT),
        )
        found = {}
        for kind in ("plain", "batch") * args.repeat:
            reset = psycopg2.connect(pg.url)
            with reset, reset.cursor() as cur:
                cur.execute("TRUNCATE public.batch_effects, public.batch_callbacks")
            reset.close()
            publish(kind, port, pg.url, n)
            out = None if args.no_profile else tmp / f"{kind}.prof"
            cpu = profile(kind, env, pg.url, n, out)
            if out is None:
                print(
                    f"[{kind}] {n} children: worker CPU {cpu:.2f} s "
                    f"({cpu / n * 1000:.3f} ms/child, start-up included)",
                    flush=True,
                )
                continue
            total, functions = cumulative(out)
            found[kind] = functions
            print(
                f"[{kind}] {n} children: worker CPU {cpu:.1f} s, profiled main thread "
                f"{total:.1f} s ({total / n * 1000:.3f} ms/child)",
                flush=True,
            )
        port.close()
    if args.no_profile:
        return
    plain, batch = found["plain"], found["batch"]
    differences = sorted(
        ((batch.get(k, 0.0) - plain.get(k, 0.0), k) for k in set(plain) | set(batch)),
        reverse=True,
    )
    print(f"cumulative ms per child, batch - plain (top {args.top}); profiles in {tmp}")
    for delta, key in differences[: args.top]:
        print(
            f"  {delta / n * 1000:+8.3f}  (plain {plain.get(key, 0.0) / n * 1000:7.3f}, "
            f"batch {batch.get(key, 0.0) / n * 1000:7.3f})  {key}"
        )


if __name__ == "__main__":
    main()
