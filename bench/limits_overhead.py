"""What the per-key limits cost a job, against the same path without them, same run.

Run: .venv/bin/python bench/limits_overhead.py [--jobs 3000] [--rounds 5]

Two measures on one real Redis, rounds alternating so drift affects all sides:

- the consumer's limits hook (``admit`` then ``release``) per job for a task without
  limits (what every PlatformTask now pays), with a concurrency cap that is never full,
  with a per-key throttle that never refuses, and with both; the baseline is one Redis
  ``PING`` per job, so a ratio reads as round trips (0.5: the cost of two pings);
- ``QueuePort.publish`` with a distinct ``unique_key`` per job against a plain publish.

Printed as jobs/s (median of the rounds) and ratios to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench._servers import bench_redis
from platform_tasks import PlatformTask, QueuePort, create_app
from platform_tasks.envelope import parse_envelope, uuid7
from platform_tasks.limits.admission import admit
from platform_tasks.settings import PlatformSettings


def tenant(envelope: Any) -> Any:
    return envelope.tenant_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with bench_redis() as server:
        settings = PlatformSettings.build(redis_url=server.url, profile="bench")
        app = create_app("bench_limits", settings=settings)
        declared = {
            "none": {},
            "cap": {"concurrency_key": tenant, "max_concurrency": 1_000_000},
            "throttle": {"throttle_key": tenant, "throttle": "1000000/s"},
            "cap+throttle": {
                "concurrency_key": tenant,
                "max_concurrency": 1_000_000,
                "throttle_key": tenant,
                "throttle": "1000000/s",
            },
        }
        tasks = {}
        for label, options in declared.items():
            name = f"bench.limits_{label.replace('+', '_')}"

            @app.task(name=name, base=PlatformTask, shared=False, **options)
            def handler(envelope: Any, tx: Any) -> None: ...

            tasks[label] = app.tasks[name]
        envelopes = [
            parse_envelope(
                {
                    "job_id": str(uuid7()),
                    "tenant_id": f"t-{n % 50}",
                    "kind": "bench.limits",
                    "correlation_id": "c",
                    "data": {},
                }
            )
            for n in range(args.jobs)
        ]

        def hook_round(task: Any) -> float:
            start = time.perf_counter()
            for envelope in envelopes:
                admit(task, envelope).release()
            return args.jobs / (time.perf_counter() - start)

        port = QueuePort(app)
        payload = {
            "tenant_id": "t-1",
            "correlation_id": "c-1",
            "kind": "bench.limits",
            "data": {"n": 1},
        }

        def publish_round(unique: bool) -> float:
            start = time.perf_counter()
            for n in range(args.jobs):
                if unique:
                    port.publish(
                        "bench",
                        payload,
                        unique_key=f"k-{n}-{time.monotonic_ns()}",
                        unique_for=timedelta(minutes=1),
                    )
                else:
                    port.publish("bench", payload)
            return args.jobs / (time.perf_counter() - start)

        client = redis.Redis.from_url(server.url)

        def ping_round() -> float:
            start = time.perf_counter()
            for _ in range(args.jobs):
                client.ping()
            return args.jobs / (time.perf_counter() - start)

        sides: dict[str, Callable[[], float]] = {
            "one PING per job": ping_round,
            **{
                f"hook: {label}": (lambda task=task: hook_round(task))
                for label, task in tasks.items()
            },
            "publish": lambda: publish_round(False),
            "publish unique_key": lambda: publish_round(True),
        }
        for run in sides.values():
            run()  # warm connections and scripts
        rates: dict[str, list[float]] = {label: [] for label in sides}
        for _ in range(args.rounds):
            for label, run in sides.items():
                rates[label].append(run())
        medians = {label: statistics.median(values) for label, values in rates.items()}
        print(f"{'side':<24} {'jobs/s (median)':>16} {'ratio':>8}")
        for label, rate in medians.items():
            base = (
                medians["publish"] if label.startswith("publish") else medians["one PING per job"]
            )
            print(f"{label:<24} {rate:>16.0f} {rate / base:>8.3f}")
        port.close()
        client.close()
        app.close()


if __name__ == "__main__":
    main()
