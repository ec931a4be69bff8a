"""Fair dequeue by tenant: start delay behind a flood, throughput, Redis memory per job.

Same worker command as ``bench/transport_throughput.py`` (``celery worker -P prefork
-c 2``, no ``-Q``), one run, baselines measured in it:

* ``latency``: ``--backlog`` jobs of tenant ``flood`` wait on the ``default`` queue
  (published in batches of 1,000 through the platform's batch publisher), a worker
  starts draining them, then one-job tenants publish one job each every ``--every``
  seconds; the start delay (start minus publish) of those jobs, p50/p99, on a fair queue
  (``PLATFORM_FAIR_QUEUES=default``) and on kombu's stock transport (``--stock-samples``
  jobs; each waits for the whole backlog).
* ``throughput``: ``--messages`` pre-filled jobs spread over 1 and over 1,000 tenants,
  drained on the fair transport and on the platform transport without fairness (the
  current default), rounds interleaved; tasks/s and the ratio fair / current per round.
* ``cpu``: Redis CPU (user + sys) per job taken with ``basic_get``, sorting included, on
  the fair and the current transport, for 1 and 1,000 tenants: the broker path alone,
  which the end-to-end rates of a loaded machine hide in noise.
* ``memory``: bytes per waiting job (``MEMORY USAGE ... SAMPLES 0``) on the queue list as
  published and once sorted onto tenant lanes (lanes, ring, counters), 1 and 1,000 tenants.

    .venv/bin/python bench/fair_dispatch.py --backlog 100000 --messages 10000 --rounds 3
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
from kombu import Connection

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from platform_tasks import QueuePort, create_app  # noqa: E402
from platform_tasks.brokers.transport import TRANSPORT_PATH  # noqa: E402
from platform_tasks.fanout.publisher import BatchPublisher  # noqa: E402
from platform_tasks.keys import fair_lane_keys  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.testing.servers import RedisServer, wait_until  # noqa: E402
from tests.support.processes import CeleryProcess, platform_env, worker_argv  # noqa: E402

QUEUE = "default"
KIND = "bench.fair_stamp"
APP = "bench.fair_bench_app"
BATCH = 1_000
FAIR = {"PLATFORM_FAIR_QUEUES": QUEUE}
CURRENT: dict[str, str] = {}
STOCK = {"PLATFORM_TRANSPORT": "stock"}


class Publisher:
    """The platform's batched publish path (one ``LPUSH`` per 1,000 jobs)."""

    def __init__(self, redis_url: str) -> None:
        settings = PlatformSettings.build(redis_url=redis_url, profile="bench")
        self.app = create_app("fair-bench-publisher", settings=settings)
        self.port = QueuePort(self.app)
        self.batch = BatchPublisher(self.app, queue=QUEUE)

    def jobs(self, tenants: list[str], data: dict[str, float] | None = None) -> None:
        """One job per entry of ``tenants``, in that order."""
        for start in range(0, len(tenants), BATCH):
            envelopes = [
                self.port.envelope({"tenant_id": t, "kind": KIND, "data": dict(data or {})})
                for t in tenants[start : start + BATCH]
            ]
            self.batch.publish(envelopes)

    def close(self) -> None:
        self.batch.close()
        self.port.close()


def waiting(client: redis.Redis) -> int:
    lane = fair_lane_keys(QUEUE)
    return int(client.llen(QUEUE)) + max(0, int(client.get(lane.waiting) or 0))


def worker(redis_url: str, env_extra: dict[str, str], logs: Path, name: str) -> CeleryProcess:
    env = platform_env(redis_url=redis_url, database_url=None, extra=env_extra, pythonpath=[REPO])
    argv = worker_argv(APP, concurrency=2, extra=["--without-heartbeat"])
    log = logs / f"{name}-{time.monotonic_ns()}.log"
    return CeleryProcess(argv, env=env, cwd=REPO, log_path=log).start()


def started(client: redis.Redis) -> int:
    return int(client.get("bench:fair:started") or 0)


# --- latency --------------------------------------------------------------------------


def latency(
    redis_url: str, logs: Path, env_extra: dict[str, str], backlog: int, samples: int, every: float
) -> list[float]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publisher = Publisher(redis_url)
    publisher.jobs(["flood"] * backlog)
    process = worker(redis_url, env_extra, logs, "latency")
    try:
        wait_until(
            lambda: started(client) > 0, timeout=120, interval=0.01, message="worker consuming"
        )
        sorting_until = None
        for n in range(samples):
            publisher.jobs([f"solo-{n}"], {"sent": time.time()})
            if sorting_until is None and client.llen(QUEUE) <= 1:
                sorting_until = n  # the flood is on lanes: later jobs wait behind no backlog
            time.sleep(every)  # the arrival pattern, not a synchronisation
        timeout = 60 + backlog / 50
        wait_until(
            lambda: client.llen("bench:fair:delays") >= samples,
            timeout=timeout,
            interval=0.05,
            message="every one-job tenant started",
        )
        flood_left = waiting(client)
    finally:
        process.stop(timeout=15)
        publisher.close()
    rows = [raw.decode().split() for raw in client.lrange("bench:fair:delays", 0, -1)]
    by_sample = {int(tenant.rsplit("-", 1)[1]): float(delay) for tenant, delay in rows}
    delays = sorted(by_sample.values())
    print(f"  flood jobs still waiting when the last one-job tenant started: {flood_left}")
    if sorting_until is not None and 0 < sorting_until < samples:
        during = sorted(d for n, d in by_sample.items() if n < sorting_until)
        after = sorted(d for n, d in by_sample.items() if n >= sorting_until)
        print(
            f"  published while the flood was still being sorted onto lanes: n={len(during)} "
            f"p50={pct(during, 0.5):.3f}s p99={pct(during, 0.99):.3f}s; after: "
            f"n={len(after)} p50={pct(after, 0.5):.3f}s p99={pct(after, 0.99):.3f}s"
        )
    return delays


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# --- throughput -----------------------------------------------------------------------


@dataclass
class Rate:
    tasks: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.tasks / self.seconds


def throughput(
    redis_url: str, logs: Path, env_extra: dict[str, str], messages: int, tenants: int
) -> Rate:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publisher = Publisher(redis_url)
    publisher.jobs([f"t{n % tenants}" for n in range(messages)])
    publisher.close()
    process = worker(redis_url, env_extra, logs, "throughput")
    try:
        wait_until(
            lambda: started(client) > 0, timeout=120, interval=0.002, message="worker consuming"
        )
        begin, first = time.monotonic(), started(client)
        wait_until(
            lambda: started(client) >= messages,
            timeout=600,
            interval=0.002,
            message="every job started",
        )
        end = time.monotonic()
    finally:
        process.stop(timeout=15)
    return Rate(messages - first, end - begin)


# --- memory ---------------------------------------------------------------------------


def key_bytes(client: redis.Redis, keys: list[str]) -> int:
    """Exact memory of ``keys`` (``MEMORY USAGE ... SAMPLES 0``)."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def memory(redis_url: str, jobs: int, tenants: int) -> tuple[float, float]:
    """Bytes per waiting job: on the queue list, and once sorted onto tenant lanes
    (lanes, ring and counters, by ``MEMORY USAGE``: allocator noise left out)."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publisher = Publisher(redis_url)
    publisher.jobs([f"t{n % tenants}" for n in range(jobs)])
    publisher.close()
    listed = key_bytes(client, [QUEUE])
    conn = Connection(
        redis_url, transport=TRANSPORT_PATH, transport_options={"fair_queues": [QUEUE]}
    )
    channel = conn.default_channel
    channel.basic_consume(QUEUE, True, lambda message: None, "memory")
    while channel.sort_arrivals():
        continue
    conn.release()
    lane = fair_lane_keys(QUEUE)
    keys = [lane.ring, lane.turn, lane.waiting, *(lane.lane(f"t{n}") for n in range(tenants))]
    assert waiting(client) == jobs, (waiting(client), jobs)
    return listed / jobs, key_bytes(client, keys) / jobs


def redis_cpu(redis_url: str, jobs: int, tenants: int, fair: bool) -> float:
    """Redis CPU (user + sys) per job taken, sorting included: the broker path alone."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publisher = Publisher(redis_url)
    publisher.jobs([f"t{n % tenants}" for n in range(jobs)])
    publisher.close()
    options = {"fair_queues": [QUEUE]} if fair else {}
    conn = Connection(redis_url, transport=TRANSPORT_PATH, transport_options=options)
    channel = conn.default_channel

    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    before = cpu()
    taken = 0
    while channel.basic_get(QUEUE, no_ack=True) is not None:
        taken += 1
    spent = cpu() - before
    conn.release()
    assert taken == jobs
    return spent / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--stock-samples", type=int, default=5)
    parser.add_argument("--every", type=float, default=0.05)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-jobs", type=int, default=100_000)
    parser.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    base = Path(tempfile.mkdtemp(prefix="bench-fair-"))
    os.chmod(base, 0o755)
    server = RedisServer(base / "redis").start()
    url = server.url
    try:
        if "latency" not in skip:
            print(f"latency: 1-job tenants behind {args.backlog} jobs of one tenant", flush=True)
            rows = []
            for name, extra, samples in (
                ("fair", FAIR, args.samples),
                ("stock", STOCK, args.stock_samples),
            ):
                if samples == 0:
                    continue
                delays = latency(url, base, extra, args.backlog, samples, args.every)
                rows.append((name, len(delays), pct(delays, 0.5), pct(delays, 0.99)))
                print(
                    f"  {name}: n={len(delays)} p50={rows[-1][2]:.3f}s p99={rows[-1][3]:.3f}s",
                    flush=True,
                )
            print("\n| transport | one-job tenants | p50 start delay | p99 start delay |")
            print("|---|---|---|---|")
            for name, n, p50, p99 in rows:
                print(f"| {name} | {n} | {p50:.3f} s | {p99:.3f} s |")
        if "throughput" not in skip:
            print(f"\nthroughput: {args.messages} jobs, fair vs current platform transport")
            ratios: dict[int, list[float]] = {1: [], 1000: []}
            rates: dict[tuple[int, str], list[float]] = {}
            for round_no in range(args.rounds):
                for tenants in (1, 1000):
                    current = throughput(url, base, CURRENT, args.messages, tenants)
                    fair = throughput(url, base, FAIR, args.messages, tenants)
                    ratio = fair.per_second / current.per_second
                    ratios[tenants].append(ratio)
                    rates.setdefault((tenants, "current"), []).append(current.per_second)
                    rates.setdefault((tenants, "fair"), []).append(fair.per_second)
                    print(
                        f"  round {round_no + 1} tenants={tenants}: current "
                        f"{current.per_second:.1f}/s fair {fair.per_second:.1f}/s "
                        f"ratio {ratio:.2f}",
                        flush=True,
                    )
            print(
                "\n| tenants | current tasks/s median | fair tasks/s median | "
                "fair / current, median (min-max) |"
            )
            print("|---|---|---|---|")
            for tenants, values in ratios.items():
                current_rate = statistics.median(rates[(tenants, "current")])
                fair_rate = statistics.median(rates[(tenants, "fair")])
                spread = f"({min(values):.2f}-{max(values):.2f})"
                print(
                    f"| {tenants} | {current_rate:.1f} | {fair_rate:.1f} | "
                    f"{statistics.median(values):.2f}x {spread} |"
                )
        if "cpu" not in skip:
            print(f"\nRedis CPU per job taken ({args.memory_jobs // 5} jobs, basic_get)")
            print("| tenants | current µs/job | fair µs/job | fair / current |")
            print("|---|---|---|---|")
            for tenants in (1, 1000):
                current = redis_cpu(url, args.memory_jobs // 5, tenants, fair=False)
                fair = redis_cpu(url, args.memory_jobs // 5, tenants, fair=True)
                print(
                    f"| {tenants} | {current:.1f} | {fair:.1f} | {fair / current:.2f}x |",
                    flush=True,
                )
        if "memory" not in skip:
            print(f"\nmemory: {args.memory_jobs} waiting jobs")
            print("| tenants | bytes/job on the queue list | bytes/job on tenant lanes |")
            print("|---|---|---|")
            for tenants in (1, 1000):
                listed, laned = memory(url, args.memory_jobs, tenants)
                print(f"| {tenants} | {listed:.0f} | {laned:.0f} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
