"""Delay store: due-to-delivered time for 10,000 entries due at once, and round trips.

Run: .venv/bin/python bench/delay_store.py [--entries 10000] [--batch 500]

Entries are scheduled through ``QueuePort.schedule_many`` to fall due at one instant;
one promoter (the production ``DelayPromoter.run_once``) then moves them. Round trips
are counted by Redis itself (INFO commandstats: script calls made by the promoter).
The baseline in the same run is a plain pipelined LPUSH of the same wire messages,
the cheapest possible way to put them on the queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench._servers import bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.keys import delay_keys
from platform_tasks.publishing.delay_promoter import DelayPromoter
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings


def script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    with bench_redis() as server:
        settings = PlatformSettings.build(
            redis_url=server.url, profile="bench", delay_batch_size=args.batch
        )
        app = create_app("bench_delays", settings=settings)
        port = QueuePort(app)
        client = redis.Redis.from_url(server.url)
        due = datetime.fromtimestamp(int(time.time()) + 3, UTC)
        items = [
            ({"tenant_id": "t", "kind": "bench.noop", "data": {"n": n}}, due)
            for n in range(args.entries)
        ]
        started = time.perf_counter()
        port.schedule_many("delayed", items)
        schedule_s = time.perf_counter() - started
        store = DelayStore(client, delay_keys("bench"))
        wires = [entry for entry in client.hvals(delay_keys("bench").entries)]

        while time.time() < due.timestamp():
            time.sleep(0.001)  # benchmark pacing, not test synchronisation
        promoter = DelayPromoter(settings)
        calls_before = script_calls(client)
        t0 = time.perf_counter()
        moved = promoter.run_once(store)
        promote_s = time.perf_counter() - t0
        round_trips = script_calls(client) - calls_before
        assert moved == args.entries and client.llen("delayed") == args.entries

        lists = [json.loads(raw)["m"] for raw in wires]
        client.delete("baseline")
        t0 = time.perf_counter()
        with client.pipeline(transaction=False) as pipe:
            for wire in lists:
                pipe.lpush("baseline", wire)
            pipe.execute()
        baseline_s = time.perf_counter() - t0
        print(f"entries:                      {args.entries}")
        print(
            f"schedule_many:                {schedule_s:.3f} s "
            f"({args.entries / schedule_s:.0f} entries/s)"
        )
        print(f"due -> all delivered:         {promote_s * 1000:.1f} ms")
        print(
            f"promoter script round trips:  {round_trips} "
            f"({round_trips / args.entries:.4f} per entry, batch {args.batch})"
        )
        print(f"baseline pipelined LPUSH:     {baseline_s * 1000:.1f} ms")
        print(f"ratio promote/baseline time:  {promote_s / baseline_s:.2f}")
        port.close()


if __name__ == "__main__":
    main()
