"""Cost of a ``/metrics`` scrape of a worker while 20,000 tenants wait on a fair queue.

A worker (``celery worker -P prefork -c 2 -Q default``, ``PLATFORM_FAIR_QUEUES=backlog``,
``PLATFORM_METRICS_PORT`` set) serves the queue gauges: ``celery_queue_length``,
``platform_queue_latency_seconds`` and ``platform_queue_waiting_by_tenant``. The queue
``backlog`` holds one job of each of ``--tenants`` tenants, sorted onto tenant lanes, and
is not consumed, so every scrape sees all of them. Measured in one run:

* bytes Redis sends per scrape (``INFO stats`` ``total_net_output_bytes``, the idle
  worker's own traffic over the same time subtracted) and the scrape's duration;
* the start delay (start minus publish) of probe jobs published on ``default`` every
  ``--every`` seconds, p50/p99, without scrapes (the baseline), while a client scrapes
  ``/metrics`` every ``--scrape-every`` seconds, and while it scrapes back to back; the
  ratio of each p99 to the baseline's is the scrapes' cost to dispatch.

    .venv/bin/python bench/fair_gauges.py --tenants 20000 --samples 500
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
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
from platform_tasks.testing.servers import RedisServer, free_port, wait_until  # noqa: E402
from tests.support.processes import CeleryProcess, platform_env, worker_argv  # noqa: E402

KIND = "bench.fair_stamp"
BACKLOG = "backlog"
"""The fair queue the worker does not consume (declared in ``fair_gauges_app``)."""
APP = "bench.fair_gauges_app"
BATCH = 1_000
DELAYS = "bench:fair:delays"


class Publisher:
    """The platform's batched publish path to one queue (one ``LPUSH`` per 1,000 jobs)."""

    def __init__(self, redis_url: str, queue: str) -> None:
        settings = PlatformSettings.build(redis_url=redis_url, profile="bench")
        self.app = create_app(f"fair-gauges-{queue}", settings=settings)
        self.port = QueuePort(self.app)
        self.batch = BatchPublisher(self.app, queue=queue)

    def jobs(self, tenants: list[str], *, stamp: bool = False) -> None:
        """One job per entry of ``tenants``; ``stamp``: carrying its publish time."""
        for start in range(0, len(tenants), BATCH):
            data = {"sent": time.time()} if stamp else {}
            envelopes = [
                self.port.envelope({"tenant_id": t, "kind": KIND, "data": dict(data)})
                for t in tenants[start : start + BATCH]
            ]
            self.batch.publish(envelopes)

    def close(self) -> None:
        self.batch.close()
        self.port.close()


def fill_backlog(redis_url: str, tenants: int) -> None:
    """One job per tenant on ``backlog``, sorted onto lanes as a fair worker sorts."""
    publisher = Publisher(redis_url, BACKLOG)
    publisher.jobs([f"tenant-{n}" for n in range(tenants)])
    publisher.close()
    conn = Connection(
        redis_url, transport=TRANSPORT_PATH, transport_options={"fair_queues": [BACKLOG]}
    )
    try:
        channel = conn.default_channel
        channel.basic_consume(BACKLOG, True, lambda message: None, "bench-sorter")
        while channel.sort_arrivals():
            continue
    finally:
        conn.release()
    client = redis.Redis.from_url(redis_url)
    assert client.llen(BACKLOG) == 0
    assert int(client.get(fair_lane_keys(BACKLOG).waiting) or 0) == tenants


def output_bytes(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        body: bytes = response.read()
    return body


def scrape_bytes(client: redis.Redis, url: str, scrapes: int) -> tuple[float, float]:
    """Bytes Redis sends per scrape (idle traffic subtracted) and seconds per scrape."""
    begin, start = output_bytes(client), time.monotonic()
    time.sleep(2.0)  # the idle worker's own traffic over a known time, not a synchronisation
    idle_rate = (output_bytes(client) - begin) / (time.monotonic() - start)
    durations = []
    begin, start = output_bytes(client), time.monotonic()
    for _ in range(scrapes):
        one = time.monotonic()
        scrape(url)
        durations.append(time.monotonic() - one)
    spent = output_bytes(client) - begin - idle_rate * (time.monotonic() - start)
    return spent / scrapes, statistics.median(durations)


def probe(
    redis_url: str, samples: int, every: float, url: str | None, scrape_every: float = 0.0
) -> tuple[list[float], int]:
    """Start delays of ``samples`` probe jobs; with ``url``, scraped meanwhile, a scrape
    starting every ``scrape_every`` seconds (0: back to back)."""
    client = redis.Redis.from_url(redis_url)
    client.delete(DELAYS)
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        assert url is not None
        while not stop.is_set():
            began = time.monotonic()
            scrape(url)
            scrapes[0] += 1
            stop.wait(max(0.0, scrape_every - (time.monotonic() - began)))

    publisher = Publisher(redis_url, "default")
    thread = threading.Thread(target=scraper, daemon=True) if url else None
    if thread is not None:
        thread.start()
        wait_until(lambda: scrapes[0] > 0, timeout=120, interval=0.01, message="first scrape")
    try:
        for n in range(samples):
            publisher.jobs([f"probe-{n}"], stamp=True)
            time.sleep(every)  # the arrival pattern, not a synchronisation
        wait_until(
            lambda: client.llen(DELAYS) >= samples,
            timeout=120,
            interval=0.02,
            message="every probe job started",
        )
    finally:
        stop.set()
        publisher.close()
        if thread is not None:
            thread.join(timeout=120)
    delays = sorted(float(raw.decode().split()[1]) for raw in client.lrange(DELAYS, 0, -1))
    return delays, scrapes[0]


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument("--every", type=float, default=0.02)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-fair-gauges-"))
    os.chmod(base, 0o755)
    server = RedisServer(base / "redis", appendonly=False).start()
    client = redis.Redis.from_url(server.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = None
    try:
        fill_backlog(server.url, args.tenants)
        env = platform_env(
            redis_url=server.url,
            database_url=None,
            extra={"PLATFORM_FAIR_QUEUES": BACKLOG, "PLATFORM_METRICS_PORT": str(port)},
            pythonpath=[REPO],
        )
        argv = worker_argv(APP, queues="default", concurrency=2, extra=["--without-heartbeat"])
        process = CeleryProcess(argv, env=env, cwd=REPO, log_path=base / "worker.log").start()
        process.wait_for_log("ready.", timeout=120)
        body = scrape(url).decode()
        assert f'celery_queue_length{{queue_name="{BACKLOG}"}} {float(args.tenants)}' in body, body
        per_scrape, seconds = scrape_bytes(client, url, args.scrapes)
        quiet, _ = probe(server.url, args.samples, args.every, None)
        paced, paced_scrapes = probe(server.url, args.samples, args.every, url, args.scrape_every)
        scraped, scrapes = probe(server.url, args.samples, args.every, url)
    finally:
        if process is not None:
            process.stop(timeout=15)
        server.stop()
    print(f"{args.tenants} tenants waiting on a fair queue, one job each")
    print(f"  bytes out of Redis per scrape: {per_scrape:,.0f}")
    print(f"  scrape duration, median of {args.scrapes}: {seconds * 1000:.1f} ms")
    print("\n| probe jobs | n | scrapes meanwhile | p50 start delay | p99 start delay |")
    print("|---|---|---|---|---|")
    print(
        f"| no scrapes (baseline) | {len(quiet)} | 0 | {pct(quiet, 0.5) * 1000:.1f} ms | "
        f"{pct(quiet, 0.99) * 1000:.1f} ms |"
    )
    print(
        f"| scraped every {args.scrape_every:g} s | {len(paced)} | {paced_scrapes} | "
        f"{pct(paced, 0.5) * 1000:.1f} ms | {pct(paced, 0.99) * 1000:.1f} ms |"
    )
    print(
        f"| scraped back to back | {len(scraped)} | {scrapes} | "
        f"{pct(scraped, 0.5) * 1000:.1f} ms | {pct(scraped, 0.99) * 1000:.1f} ms |"
    )
    base_p99 = pct(quiet, 0.99)
    print(
        f"\np99 / baseline p99: every {args.scrape_every:g} s "
        f"{pct(paced, 0.99) / base_p99:.2f}x, back to back {pct(scraped, 0.99) / base_p99:.2f}x"
    )


if __name__ == "__main__":
    main()
