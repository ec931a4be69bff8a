"""Peak Redis memory of one large blast, unbounded against ``publish_blast``'s back-pressure.

Run: .venv/bin/python bench/blast_memory.py [--recipients 1000000] [--drain-rate 100]
                                            [--bound 1000]

Each variant gets a fresh Redis (so ``used_memory_peak`` is its own) and the same
PostgreSQL (``core.processed_jobs`` emptied between variants). ``publish_blast`` publishes
``--recipients`` addresses in chunks of 100 through a real ``QueuePort`` onto
``notif.email.marketing``, once with ``max_in_flight=None`` (no bound: what
``publish_blast`` did before its back-pressure) and once with ``max_in_flight=--bound``.
In both, a consumer stand-in takes jobs off the queue at ``--drain-rate`` jobs per second
(``RPOP``) and settles them (a ``core.processed_jobs`` row each, as a worker's commit
writes): a marketing rail drains at its provider's request rate, one job a request, and
a worker's render and send are not what this measures. A sampler reads ``INFO memory``
and the queue's length every 20 ms. Reported per variant: ``used_memory`` before,
the sampled peak and the server's own ``used_memory_peak`` (MiB), the deepest queue
seen, and the publisher's wall time.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import psycopg2.extras
import redis

from bench._servers import bench_postgres, bench_redis

QUEUE = "notif.email.marketing"
MIB = 1024 * 1024


@dataclass
class Result:
    variant: str
    baseline: int
    sampled_peak: int
    server_peak: int
    deepest: int
    publish_seconds: float
    jobs: int


class Drainer(threading.Thread):
    """Takes ``rate`` jobs a second off the queue and writes their idempotency rows."""

    def __init__(self, redis_url: str, database_url: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.conn = psycopg2.connect(database_url)
        self.rate = rate
        self.stop = threading.Event()
        self.taken = 0

    def run(self) -> None:
        import json

        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.taken
            if due <= 0:
                time.sleep(0.01)  # pacing of the stand-in consumer
                continue
            raws = self.client.rpop(QUEUE, due) or []
            if not raws:
                time.sleep(0.01)
                started = time.monotonic() - self.taken / self.rate  # no credit while idle
                continue
            ids = [(json.loads(raw)["headers"]["id"],) for raw in raws]
            with self.conn, self.conn.cursor() as cur:
                psycopg2.extras.execute_values(
                    cur,
                    "INSERT INTO core.processed_jobs (job_id, consumer) VALUES %s",
                    ids,
                    template="(%s, 'bench')",
                )
            self.taken += len(ids)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=10)
        self.client.close()
        self.conn.close()


class Sampler(threading.Thread):
    def __init__(self, redis_url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.stop = threading.Event()
        self.peak = 0
        self.deepest = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, int(self.client.info("memory")["used_memory"]))
            self.deepest = max(self.deepest, int(self.client.llen(QUEUE)))
            time.sleep(0.02)  # sampling period

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=10)
        self.client.close()


def run_variant(
    variant: str, database_url: str, recipients: int, drain_rate: float, bound: int | None
) -> Result:
    from platform_tasks import QueuePort, create_app
    from platform_tasks.notifications import publish_blast
    from platform_tasks.settings import PlatformSettings

    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute("TRUNCATE core.processed_jobs")
    conn.close()
    with bench_redis() as server:
        client = redis.Redis.from_url(server.url)
        settings = PlatformSettings.build(
            redis_url=server.url, database_url=database_url, profile="bench"
        )
        app = create_app("bench_blast", settings=settings)
        port = QueuePort(app)
        port.publish(QUEUE, {"tenant_id": "warm", "kind": "bench.news", "data": {}})
        client.delete(QUEUE)  # connections and scripts set up before the baseline
        baseline = int(client.info("memory")["used_memory"])
        sampler = Sampler(server.url)
        drainer = Drainer(server.url, database_url, drain_rate)
        sampler.start()
        drainer.start()
        started = time.monotonic()
        ids = publish_blast(
            port,
            kind="bench.news",
            tenant_id="acme",
            campaign_id="bench",
            recipients=(f"subscriber-{n:07d}@example.org" for n in range(recipients)),
            data={"template": "spring-newsletter"},
            max_in_flight=bound,
        )
        publish_seconds = time.monotonic() - started
        time.sleep(0.1)  # one more sample after the last publish
        sampler.close()
        drainer.close()
        server_peak = int(client.info("memory")["used_memory_peak"])
        client.close()
        port.close()
        app.close()
    return Result(
        variant, baseline, sampler.peak, server_peak, sampler.deepest, publish_seconds, len(ids)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipients", type=int, default=1_000_000)
    parser.add_argument("--drain-rate", type=float, default=100.0)
    parser.add_argument("--bound", type=int, default=1000)
    args = parser.parse_args()
    from platform_tasks.postgres.migrations import migrate

    with bench_postgres() as pg:
        migrate(pg.url)
        results = [
            run_variant(
                "unbounded (max_in_flight=None)", pg.url, args.recipients, args.drain_rate, None
            ),
            run_variant(
                f"bounded (max_in_flight={args.bound})",
                pg.url,
                args.recipients,
                args.drain_rate,
                args.bound,
            ),
        ]
    print(f"{args.recipients:,} recipients in chunks of 100, consumer {args.drain_rate:g} jobs/s")
    print(
        "| variant | jobs | used_memory before | sampled peak | used_memory_peak | peak - before"
        " | deepest queue | publish wall time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.variant} | {r.jobs:,} | {r.baseline / MIB:.1f} MiB | "
            f"{r.sampled_peak / MIB:.1f} MiB | {r.server_peak / MIB:.1f} MiB | "
            f"{(r.server_peak - r.baseline) / MIB:.1f} MiB | {r.deepest:,} | "
            f"{r.publish_seconds:.1f} s |"
        )
    unbounded, bounded = results
    per_job = (unbounded.server_peak - unbounded.baseline) / max(1, unbounded.deepest)
    ratio = (bounded.server_peak - bounded.baseline) / max(
        1, unbounded.server_peak - unbounded.baseline
    )
    print(f"Redis per queued job (unbounded peak growth / deepest queue): {per_job / 1024:.1f} KiB")
    print(f"bounded / unbounded peak growth: {ratio:.3f}")


if __name__ == "__main__":
    main()
