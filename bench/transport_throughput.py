"""Throughput and worker main-process CPU per task: the platform app vs plain Celery.

Same run, same machine, same worker command (``celery worker -P prefork -c 2``). The
baseline is what a user starts from: a plain Celery app with Celery's defaults (stock
kombu transport, task events off, prefetch multiplier 4) and late acks. The other rows
are the platform app with its own defaults (events on, prefetch 1), on kombu's stock
transport and on the platform transport. Each variant drains a queue pre-filled with
``--messages`` tasks; the clock and the main process's CPU time (utime + stime from
``/proc/<pid>/stat``) are read when the queue starts shrinking and when it is empty with
nothing left unacked. Variants run interleaved for ``--rounds`` rounds; each round's
ratio is against the plain Celery no-op of the same round, and the median and range over
rounds are reported. ``bench/celery_baselines.py`` compares more baselines (events on,
Dramatiq) at one prefetch multiplier for every row.

    .venv/bin/python bench/transport_throughput.py --messages 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from platform_tasks import QueuePort, create_app  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from tests.support.processes import CeleryProcess, platform_env, worker_argv  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
QUEUE = "default"


@dataclass(frozen=True)
class Variant:
    name: str
    transport: str
    task: str
    app: str = "bench.transport_bench_app"
    queue: str = QUEUE


VARIANTS = [
    Variant(
        "plain Celery no-op (events off)", "stock", "bench.noop", "bench.plain_celery_app", "celery"
    ),
    Variant("platform app, stock transport", "stock", "bench.noop"),
    Variant("platform no-op", "platform", "bench.noop"),
    Variant("platform PlatformTask", "platform", "bench.platform_noop"),
]


@dataclass
class Result:
    variant: Variant
    tasks: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds

    @property
    def cpu_ms_per_task(self) -> float:
        return self.cpu_seconds * 1000 / self.tasks


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def publish(variant: Variant, redis_url: str, database_url: str, count: int) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url,
        database_url=database_url,
        profile="bench",
        transport=variant.transport,
    )
    if variant.app == "bench.plain_celery_app":
        os.environ["PLATFORM_REDIS_URL"] = redis_url  # the plain app's broker, as its worker's
        from bench.plain_celery_app import app as plain_app

        with plain_app.producer_or_acquire() as producer:
            for _ in range(count):
                plain_app.send_task(variant.task, producer=producer)
        return
    app = create_app(f"bench-publisher-{variant.transport}", settings=settings)
    if variant.task == "bench.platform_noop":
        port = QueuePort(app)
        for n in range(count):
            port.publish(QUEUE, {"tenant_id": "bench", "kind": variant.task, "data": {"n": n}})
        return
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            app.send_task(variant.task, queue=QUEUE, producer=producer)


def measure(variant: Variant, redis_url: str, database_url: str, count: int, logs: Path) -> Result:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publish(variant, redis_url, database_url, count)
    queue = variant.queue
    assert client.llen(queue) == count, "messages were not all published"
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_TRANSPORT": variant.transport},
        pythonpath=[REPO],
    )
    argv = worker_argv(variant.app, concurrency=2, extra=["--without-heartbeat"])
    log = logs / f"{variant.name.replace(' ', '-')}-{time.monotonic_ns()}.log"
    worker = CeleryProcess(argv, env=env, cwd=REPO, log_path=log).start()
    try:
        wait_until(
            lambda: client.llen(queue) < count,
            timeout=60,
            interval=0.002,
            message="worker to start consuming",
        )
        start, cpu_start, left = time.monotonic(), cpu_seconds(worker.pid), client.llen(queue)

        def drained() -> bool:
            return client.llen(queue) == 0 and client.hlen("unacked") == 0

        wait_until(drained, timeout=300, interval=0.002, message="queue drained and acked")
        end, cpu_end = time.monotonic(), cpu_seconds(worker.pid)
    finally:
        worker.stop(timeout=15)
    return Result(variant, int(left), end - start, cpu_end - cpu_start)


def _spread(values: list[float], fmt: str) -> str:
    return (
        f"{format(statistics.median(values), fmt)} "
        f"({format(min(values), fmt)}-{format(max(values), fmt)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    os.chmod(base, 0o755)
    redis_server = RedisServer(base / "redis").start()
    postgres = PostgresServer(base / "pg" / "data").start()
    try:
        migrate(postgres.url)
        rounds: list[dict[str, Result]] = []
        for round_no in range(args.rounds):
            results: dict[str, Result] = {}
            for variant in VARIANTS:
                result = measure(variant, redis_server.url, postgres.url, args.messages, base)
                results[variant.name] = result
                baseline = results[VARIANTS[0].name]
                line = (
                    f"round {round_no + 1} {variant.name:24s} {result.rate:8.1f} tasks/s "
                    f"({result.rate / baseline.rate:.2f}x plain Celery of this round) "
                    f"{result.cpu_ms_per_task:6.3f} ms CPU/task (main process)"
                )
                print(line, flush=True)
            rounds.append(results)
        print(
            "\n| variant | tasks/s median (min-max) | ratio vs plain Celery no-op, median of "
            "rounds (min-max) | main-process CPU ms/task median (min-max) |"
        )
        print("|---|---|---|---|")
        for variant in VARIANTS:
            rates = [r[variant.name].rate for r in rounds]
            ratios = [r[variant.name].rate / r[VARIANTS[0].name].rate for r in rounds]
            cpus = [r[variant.name].cpu_ms_per_task for r in rounds]
            print(
                f"| {variant.name} | {_spread(rates, '.1f')} | {_spread(ratios, '.2f')}x | "
                f"{_spread(cpus, '.3f')} |"
            )
    finally:
        postgres.close()
        redis_server.stop()


if __name__ == "__main__":
    main()
