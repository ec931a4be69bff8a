"""QueuePort.publish rate against raw ``app.send_task`` of the same body, same run.

Run: .venv/bin/python bench/publish_vs_send_task.py [--messages 5000] [--rounds 5]

Both sides publish to the same real Redis; rounds alternate so drift affects both.
The ratio is publish rate / send_task rate (target at least 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench._servers import bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with bench_redis() as server:
        settings = PlatformSettings.build(redis_url=server.url, profile="bench")
        app = create_app("bench_publish", settings=settings)
        port = QueuePort(app)
        client = redis.Redis.from_url(server.url)
        data = {"invoice_id": 1234, "amount_cents": 999, "currency": "EUR"}

        def raw_round() -> float:
            start = time.perf_counter()
            for _ in range(args.messages):
                job_id = str(uuid7())
                body = {
                    "job_id": job_id,
                    "tenant_id": "t-1",
                    "correlation_id": "c-1",
                    "kind": "billing.charge",
                    "data": data,
                }
                app.send_task(
                    "billing.charge",
                    args=[body],
                    task_id=job_id,
                    queue="raw",
                    argsrepr="()",
                    kwargsrepr="{}",
                    headers={"platform_attempt": 1},
                )
            return args.messages / (time.perf_counter() - start)

        def port_round() -> float:
            start = time.perf_counter()
            for _ in range(args.messages):
                port.publish(
                    "port",
                    {
                        "tenant_id": "t-1",
                        "correlation_id": "c-1",
                        "kind": "billing.charge",
                        "data": data,
                    },
                )
            return args.messages / (time.perf_counter() - start)

        raw_round()
        port_round()  # warm both paths (connections, declarations)
        raw_rates, port_rates = [], []
        for _ in range(args.rounds):
            raw_rates.append(raw_round())
            port_rates.append(port_round())
            client.delete("raw", "port")
        raw, ported = statistics.median(raw_rates), statistics.median(port_rates)
        print(f"send_task:          {raw:8.0f} msg/s (median of {args.rounds})")
        print(f"QueuePort.publish:  {ported:8.0f} msg/s (median of {args.rounds})")
        print(f"ratio publish/send_task: {ported / raw:.3f} (target >= 0.9)")
        port.close()


if __name__ == "__main__":
    main()
