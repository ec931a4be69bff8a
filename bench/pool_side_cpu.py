"""CPU a pool process spends per job, in one process through Celery's tracer: plain Celery's
INSERT, the PlatformTask's SQL sent by hand (the SQL floor), the PlatformTask, a no-op.

Usage: .venv/bin/python bench/pool_side_cpu.py [--jobs 1000] [--rounds 11] [--sections]

Why: the throughput benchmarks measure the whole machine at once (the worker's main
process, its pool, PostgreSQL, RabbitMQ); this one isolates the pool process's own work,
where the platform's Python runs, without a broker: each job is handed to the task's
Celery tracer (``celery.app.trace.build_tracer``, what a prefork pool process calls) with
the delivery info of a declared queue, against a PostgreSQL and a Redis of its own. Rounds
of the tasks of ``bench/consumer_app.py`` are taken in turn; medians of the CPU time
(``time.process_time``: user and system, so the socket calls count) are printed.

``--sections`` then times the steps of the PlatformTask's pipeline in further rounds of it
alone: each step is wrapped to add up its own CPU time, and every wrapper adds a
``process_time`` call pair (about a microsecond), so read the sections against each other
and against the total, not as exact costs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rabbitmq_throughput import create_bench_schema  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer  # noqa: E402

TASKS = ("bench.plain", "bench.sql_floor", "bench.platform", "bench.noop")
QUEUE = "bench_pool_side"


@contextlib.contextmanager
def pool_side_servers(prefix: str) -> Iterator[dict[str, str]]:
    """A PostgreSQL with the bench schema and a Redis of the benchmark's own, stopped at
    exit: the platform's variables that point at them.

    The broker's URL is RabbitMQ's scheme on a port nothing listens on: the platform's
    Redis is not the broker, as on RabbitMQ, and no broker is contacted.
    """
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    pg = PostgresServer(base / "pg" / "data").start()
    rs = RedisServer(base / "redis").start()
    try:
        create_bench_schema(pg.url)
        yield {
            "PLATFORM_DATABASE_URL": pg.url,
            "PLATFORM_REDIS_URL": rs.url,
            "PLATFORM_BROKER_URL": "amqp://bench@127.0.0.1:1//",
        }
    finally:
        rs.stop()
        pg.close()


def tracers(app: Any) -> dict[str, Callable[..., Any]]:
    from celery.app.trace import build_tracer

    app.finalize()
    app.amqp.queues.select_add(QUEUE)  # as ``-Q`` declares it in a worker
    return {
        name: build_tracer(name, app.tasks[name], eager=False, propagate=False, app=app)
        for name in TASKS
    }


def run_jobs(trace: Callable[..., Any], task: str, jobs: int) -> None:
    from platform_tasks.envelope import uuid7

    for _ in range(jobs):
        job_id = str(uuid7())
        envelope = {
            "job_id": job_id,
            "tenant_id": "bench",
            "correlation_id": "bench",
            "kind": task,
            "data": {},
        }
        request = {
            "id": job_id,
            "task": task,
            "hostname": "bench@localhost",
            "headers": {},
            "is_eager": False,
            "delivery_info": {
                "exchange": "",
                "routing_key": QUEUE,
                "priority": 0,
                "redelivered": False,
            },
        }
        trace(job_id, [envelope], {}, request)


def sections(app: Any, trace: Callable[..., Any], jobs: int, rounds: int) -> None:
    """Time the pipeline's steps (see the module docstring)."""
    from platform_tasks.consumer import pipeline as module
    from platform_tasks.consumer.delivery import Delivery
    from platform_tasks.consumer.task import PlatformTask
    from platform_tasks.consumer.transaction import JobTransaction

    spent: collections.Counter[str] = collections.Counter()

    def timed(owner: Any, name: str) -> None:
        step = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time_ns()
            try:
                return step(*args, **kwargs)
            finally:
                spent[name] += time.process_time_ns() - start

        setattr(owner, name, wrapper)

    pipeline = module.pipeline_for(app)
    for name in ("process", "decide", "settle"):
        timed(pipeline, name)
    timed(module, "parse_envelope")  # the name the pipeline calls
    timed(Delivery, "from_request")
    for name in ("claim_and_look", "broken", "commit", "end"):
        timed(JobTransaction, name)
    timed(PlatformTask, "execute")
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        spent.clear()
        start = time.process_time_ns()
        run_jobs(trace, "bench.platform", jobs)
        totals["whole job"].append((time.process_time_ns() - start) / jobs / 1000)
        for name, nanoseconds in spent.items():
            totals[name].append(nanoseconds / jobs / 1000)
    print(
        "PlatformTask by step, CPU per job (median us): "
        + ", ".join(f"{name} {statistics.median(values):.1f}" for name, values in totals.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--sections", action="store_true")
    args = parser.parse_args()
    with pool_side_servers("bench-pool-side-") as variables:
        os.environ.update(variables)
        from bench.consumer_app import app

        by_task = tracers(app)
        for task, trace in by_task.items():  # first jobs: connections, imports
            run_jobs(trace, task, 200)
        cpu: dict[str, list[float]] = {task: [] for task in TASKS}
        for _ in range(args.rounds):
            for task, trace in by_task.items():
                start = time.process_time()
                run_jobs(trace, task, args.jobs)
                cpu[task].append((time.process_time() - start) / args.jobs)
        for task, values in cpu.items():
            print(
                f"{task:16s} pool-side CPU per job: median "
                f"{statistics.median(values) * 1e6:4.0f} us (rounds "
                f"{min(values) * 1e6:.0f}-{max(values) * 1e6:.0f})"
            )
        if args.sections:
            sections(app, by_task["bench.platform"], args.jobs, args.rounds)


if __name__ == "__main__":
    main()
