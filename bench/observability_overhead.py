"""CPU a publish spends on observability: trace/custom headers, the ready time and the
``celery_task_sent_total`` count, against the same publish without them, same run.

Run: .venv/bin/python bench/observability_overhead.py [--messages 3000] [--rounds 7]

Why CPU time (``time.process_time``) and not a rate: on a shared machine the wall clock
swings with other people's load, while the CPU this process spends per publish does not.
Three variants, in turn, publishing to the same real Redis:

- ``baseline``: headers built as before observability (``dict(opts.headers)``), no
  ``after_task_publish`` counter;
- ``shipped``: as the platform publishes now, outside any span;
- ``in span``: the same inside an active OpenTelemetry span (the W3C context injected).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import signals

from bench._servers import bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.consumer import exporter_metrics as celery_exporter_metrics
from platform_tasks.publishing import queue_port as queue_port_module
from platform_tasks.settings import PlatformSettings


@contextmanager
def baseline() -> Iterator[None]:
    """Headers as the queue port built them before, and no sent counter."""
    shipped = queue_port_module.outgoing_headers

    def plain(custom: Any, *, published_at: float) -> dict[str, Any]:
        return dict(custom)

    queue_port_module.outgoing_headers = plain  # type: ignore[assignment]
    signals.after_task_publish.disconnect(dispatch_uid="platform_tasks.celery_exporter._on_sent")
    try:
        yield
    finally:
        queue_port_module.outgoing_headers = shipped
        signals.after_task_publish.connect(
            celery_exporter_metrics._on_sent,
            weak=False,
            dispatch_uid="platform_tasks.celery_exporter._on_sent",
        )


@contextmanager
def nothing() -> Iterator[None]:
    yield


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("bench")

    @contextmanager
    def in_span() -> Iterator[None]:
        with tracer.start_as_current_span("request"):
            yield

    with bench_redis() as server:
        settings = PlatformSettings.build(redis_url=server.url, profile="bench")
        app = create_app("bench_observability", settings=settings)
        port = QueuePort(app)
        client = redis.Redis.from_url(server.url)
        data = {"invoice_id": 1234, "amount_cents": 999, "currency": "EUR"}

        def one_round(setting: Callable[[], Any]) -> float:
            with setting():
                start = time.process_time()
                for _ in range(args.messages):
                    port.publish(
                        "q",
                        {
                            "tenant_id": "t-1",
                            "correlation_id": "c-1",
                            "kind": "billing.charge",
                            "data": data,
                        },
                        {"headers": {"x-source": "web"}},
                    )
                spent = time.process_time() - start
            client.delete("q")
            return spent / args.messages * 1e6

        variants: dict[str, Callable[[], Any]] = {
            "baseline": baseline,
            "shipped": nothing,
            "in span": in_span,
        }
        for setting in variants.values():
            one_round(setting)  # warm every path
        costs: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, setting in variants.items():
                costs[name].append(one_round(setting))
        base = statistics.median(costs["baseline"])
        for name, values in costs.items():
            median = statistics.median(values)
            print(
                f"{name:9s} {median:7.1f} µs CPU/publish (median of {args.rounds}, "
                f"range {min(values):.1f}-{max(values):.1f})  ratio {median / base:.3f}"
            )
        port.close()
        client.close()


if __name__ == "__main__":
    main()
