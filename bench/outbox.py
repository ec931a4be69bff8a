"""The transactional outbox against direct publishing, every ratio measured in one run.

Run: .venv/bin/python bench/outbox.py [--publishes 3000] [--rounds 3] [--rows 20000]
     [--latency-jobs 600] [--parts producer,relay,latency]

1. Producer throughput: ``publish(..., tx=conn)`` with the client's ``COMMIT`` per publish
   against a direct ``publish`` to Redis (alternating rounds; target at least 0.5).
2. Relay throughput: ``--rows`` committed rows relayed onto Redis (claim and delete, one
   pipelined round trip per batch, commit) against three ways of pushing the same wire
   messages in batches of the same size without an outbox: one pipelined ``LPUSH`` per
   message (what a publisher sends), one variadic ``LPUSH`` per batch (the fewest Redis
   commands), and reading the rows from PostgreSQL batch by batch (no lock, no delete)
   then one ``LPUSH`` per batch (a copy that guarantees nothing). Target at least 0.8.
3. Commit-to-start latency: a real ``celery worker -P prefork -c 2`` whose handler records
   when it started; its capacity is measured with direct publishes first, then jobs are
   published with ``tx=`` at half of it, each timed from its ``COMMIT`` to the start of its
   handler (the relay in the worker woken by ``LISTEN/NOTIFY``), and the same at the same
   rate with direct publishes (from the publish) as the baseline, and once more with the
   consuming worker's relay off and a relay in a worker of its own (``-Q`` a queue no job
   goes to). p50, p90 and p99 (target p99 under 50 ms). ``BENCH_SWITCH_INTERVAL=<seconds>``
   in the environment sets the workers' GIL switch interval (``sys.setswitchinterval``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import redis

from bench._servers import bench_postgres, bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.kernel import PlatformCelery
from platform_tasks.postgres.migrations import migrate
from platform_tasks.publishing.outbox_relay import OutboxRelay
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until

ROOT = Path(__file__).resolve().parent.parent
DATA = {"invoice_id": 1234, "amount_cents": 999, "currency": "EUR"}


def payload(kind: str = "billing.charge") -> dict[str, object]:
    return {"tenant_id": "t-1", "correlation_id": "c-1", "kind": kind, "data": DATA}


def producer_throughput(
    port: QueuePort, db_url: str, client: redis.Redis, n: int, rounds: int
) -> None:
    conn = psycopg2.connect(db_url)

    def direct() -> float:
        start = time.perf_counter()
        for _ in range(n):
            port.publish("direct", payload(), tx=None)
        return n / (time.perf_counter() - start)

    def in_tx() -> float:
        start = time.perf_counter()
        for _ in range(n):
            port.publish("outbox", payload(), tx=conn)
            conn.commit()
        return n / (time.perf_counter() - start)

    def clear() -> None:
        client.delete("direct", "outbox")
        with conn.cursor() as cur:
            cur.execute("TRUNCATE core.outbox")
        conn.commit()

    direct(), in_tx(), clear()  # warm both paths
    direct_rates, tx_rates = [], []
    for _ in range(rounds):
        direct_rates.append(direct())
        tx_rates.append(in_tx())
        clear()
    d, t = statistics.median(direct_rates), statistics.median(tx_rates)
    print(f"[producer] direct publish:           {d:8.0f} publishes/s (median of {rounds})")
    print(f"[producer] publish(tx=) + COMMIT:    {t:8.0f} publishes/s (median of {rounds})")
    print(f"[producer] ratio tx/direct: {t / d:.2f} (target >= 0.5)")
    conn.close()


def _timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def relay_throughput(
    app: PlatformCelery, port: QueuePort, db_url: str, client: redis.Redis, rows: int
) -> dict[str, float]:
    """One round: ``rows`` committed rows, three raw baselines on the same bytes, then the
    relay; the relay's rate over each baseline's."""
    conn = psycopg2.connect(db_url)
    with conn:
        for _ in range(rows):
            port.publish("relayed", payload(), tx=conn)
    with conn.cursor() as cur:
        cur.execute("SELECT message FROM core.outbox ORDER BY id")
        messages = [m for (m,) in cur.fetchall()]
    conn.rollback()
    batch = port.settings.outbox_batch_size
    chunks = [messages[i : i + batch] for i in range(0, len(messages), batch)]

    def per_message() -> None:  # one LPUSH per message, pipelined per batch
        for chunk in chunks:
            with client.pipeline(transaction=False) as pipe:
                for message in chunk:
                    pipe.lpush("raw", message)
                pipe.execute()

    def variadic() -> None:  # one LPUSH per batch
        for chunk in chunks:
            client.lpush("raw", *chunk)

    def read_and_push() -> None:  # the same rows read batch by batch, no lock, no delete
        last = 0
        with conn.cursor() as cur:
            # the claim's plan (index order): statistics from just before the rows were
            # committed would make every batch a sort of every row
            cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
            while True:
                cur.execute(
                    "SELECT id, message FROM core.outbox WHERE profile = %s AND id > %s "
                    "ORDER BY id LIMIT %s",
                    ("bench", last, batch),
                )
                found = cur.fetchall()
                if not found:
                    break
                client.lpush("raw", *[message for _, message in found])
                last = found[-1][0]
        conn.rollback()

    times = {}
    for name, work in (("per_message", per_message), ("variadic", variadic)):
        times[name] = _timed(work)
        client.delete("raw")
    times["read_and_push"] = _timed(read_and_push)
    client.delete("raw")
    conn.close()
    relay = OutboxRelay(app, metrics=False)
    moved = 0

    def relay_all() -> None:
        nonlocal moved
        moved = relay.run_once()

    times["relay"] = _timed(relay_all)
    relay.close()
    assert moved == rows and client.llen("relayed") == rows, (moved, client.llen("relayed"))
    client.delete("relayed")
    rates = {name: rows / seconds for name, seconds in times.items()}
    print(
        f"[relay] msg/s: raw LPUSH per message {rates['per_message']:7.0f}, raw LPUSH per "
        f"batch {rates['variadic']:7.0f}, read+LPUSH per batch {rates['read_and_push']:7.0f}, "
        f"relay {rates['relay']:7.0f}"
    )
    return {name: times[name] / times["relay"] for name in times if name != "relay"}


def report_relay(ratios: list[dict[str, float]]) -> None:
    for name, label in (
        ("per_message", "raw pipelined LPUSH, one per message"),
        ("variadic", "raw LPUSH, one per batch"),
        ("read_and_push", "read from PostgreSQL + LPUSH per batch"),
    ):
        values = [round(r[name], 2) for r in ratios]
        print(
            f"[relay] relay / {label:40s} median {statistics.median(values):.2f} "
            f"(rounds {values}; target >= 0.8)"
        )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _worker(
    env: dict[str, str], log: Path, *, queues: str | None = None, **extra: str
) -> subprocess.Popen[bytes]:
    argv = [str(Path(sys.executable).parent / "celery"), "-A", "bench.outbox_app", "worker"]
    argv += ["-P", "prefork", "-c", "2"] if queues is None else ["-P", "solo", "-Q", queues]
    argv += ["--without-mingle", "--without-gossip", "--loglevel", "WARNING"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, env={**env, **extra}, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(60)


def latency(port: QueuePort, redis_url: str, db_url: str, jobs: int, tmp: Path) -> None:
    """Commit-to-start latency: direct publishes, ``tx=`` with the relay in the consuming
    worker (the default), and ``tx=`` with the consuming worker's relay off and a relay in
    a worker of its own (``-Q`` a queue no job goes to), all at the same rate."""
    client = redis.Redis.from_url(redis_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    env.update(
        PLATFORM_REDIS_URL=redis_url,
        PLATFORM_DATABASE_URL=db_url,
        PLATFORM_PROFILE="bench",
        PYTHONPATH=str(ROOT),
    )

    def run(use_tx: bool, rate: float) -> list[float]:
        conn = psycopg2.connect(db_url)
        sent: dict[str, float] = {}
        t0 = time.perf_counter()
        for i in range(jobs):
            due = t0 + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the producer, not synchronisation
            if use_tx:
                job = port.publish("bench_outbox", payload("bench.started"), tx=conn)
                conn.commit()
            else:
                job = port.publish("bench_outbox", payload("bench.started"), tx=None)
            sent[str(job)] = time.time()
        conn.close()
        wait_until(lambda: client.hlen("bench:started") >= jobs, timeout=300, interval=0.05)
        started = {k.decode(): float(v) for k, v in client.hgetall("bench:started").items()}
        client.delete("bench:started")
        return [(started[job] - at) * 1000 for job, at in sent.items()]

    def show(name: str, ms: list[float]) -> None:
        print(
            f"[latency] {name:40s} p50 {percentile(ms, 50):6.1f} ms  "
            f"p90 {percentile(ms, 90):6.1f} ms  p99 {percentile(ms, 99):6.1f} ms  "
            f"max {max(ms):6.1f} ms  ({len(ms)} jobs)"
        )

    worker = _worker(env, tmp / "worker.log")
    try:
        warm = [port.publish("bench_outbox", payload("bench.started"), tx=None) for _ in range(20)]
        wait_until(lambda: client.hlen("bench:started") >= len(warm), timeout=120)
        client.delete("bench:started")
        # capacity: a burst of direct publishes, drained at the worker's full rate
        burst = max(200, jobs // 2)
        start = time.time()
        for _ in range(burst):
            port.publish("bench_outbox", payload("bench.started"), tx=None)
        wait_until(lambda: client.hlen("bench:started") >= burst, timeout=300, interval=0.01)
        capacity = burst / (max(float(v) for v in client.hvals("bench:started")) - start)
        client.delete("bench:started")
        rate = capacity / 2
        print(f"[latency] worker capacity {capacity:.0f} jobs/s; publishing at {rate:.0f}/s")
        show("direct publish -> start", run(False, rate))
        show("tx COMMIT -> start, relay in the worker", run(True, rate))
    finally:
        _stop(worker)
    worker = _worker(env, tmp / "worker-2.log", PLATFORM_OUTBOX_RELAY="false")
    relay = _worker(env, tmp / "relay.log", queues="bench_relay_only")
    try:
        conn = psycopg2.connect(db_url)
        with conn:  # through the relay: both workers are up
            warm = [
                port.publish("bench_outbox", payload("bench.started"), tx=conn) for _ in range(20)
            ]
        conn.close()
        wait_until(lambda: client.hlen("bench:started") >= len(warm), timeout=120)
        client.delete("bench:started")
        show("tx COMMIT -> start, relay in its own worker", run(True, rate))
    finally:
        _stop(worker, relay)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--publishes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--latency-jobs", type=int, default=600)
    parser.add_argument(
        "--parts", default="producer,relay,latency", help="which measurements to run"
    )
    args = parser.parse_args()
    with bench_redis() as server, bench_postgres() as pg:
        migrate(pg.url)
        settings = PlatformSettings.build(
            redis_url=server.url, database_url=pg.url, profile="bench"
        )
        app = create_app("bench_outbox_producer", settings=settings)
        port = QueuePort(app)
        client = redis.Redis.from_url(server.url)
        parts = set(args.parts.split(","))
        if "producer" in parts:
            producer_throughput(port, pg.url, client, args.publishes, args.rounds)
        if "relay" in parts:
            report_relay(
                [relay_throughput(app, port, pg.url, client, args.rows) for _ in range(args.rounds)]
            )
        if "latency" in parts:
            latency(port, server.url, pg.url, args.latency_jobs, Path(tempfile.mkdtemp()))
        port.close()
        client.close()


if __name__ == "__main__":
    main()
