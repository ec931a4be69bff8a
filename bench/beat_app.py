"""Celery app for bench/beat_admission.py: LeaseScheduler or stock PersistentScheduler,
both instrumented only to record lateness, tick count and CPU into BENCH_OUT at close."""

from __future__ import annotations

import json
import os
import resource
import time
from datetime import timedelta
from typing import Any

from celery.beat import PersistentScheduler

from platform_tasks import create_app
from platform_tasks.jobs.beat import LeaseScheduler

app = create_app("bench_beat_app")


@app.task(name="bench.noop")
def noop() -> None:
    """Never consumed: the benchmark measures triggering only."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Recorder:
    def __init__(self) -> None:
        self.lateness_ms: list[float] = []
        self.ticks = 0
        self.busy_ticks = 0
        self.cpu_at_start = _cpu()
        self.points = 0

    def dump(self, kind: str) -> None:
        out = os.environ.get("BENCH_OUT")
        if not out:
            return
        with open(f"{out}.{kind}.{os.getpid()}.json", "w") as handle:
            json.dump(
                {
                    "kind": kind,
                    "ticks": self.ticks,
                    "busy_ticks": self.busy_ticks,
                    "cpu_s": _cpu() - self.cpu_at_start,
                    "lateness_ms": self.lateness_ms,
                    "points": self.points,
                },
                handle,
            )


class MeasuredLeaseScheduler(LeaseScheduler):
    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.recorder = _Recorder()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        before = self.engine.round_trips if self.engine else 0
        wait = super().tick(*args, **kwargs)
        self.recorder.ticks += 1
        if self.engine and self.engine.round_trips != before:
            self.recorder.busy_ticks += 1
        return wait

    def _dispatch(self, admitted: Any) -> None:
        super()._dispatch(admitted)
        sent_at = time.time() * 1000  # after the publish batch reached the broker
        self.recorder.lateness_ms.extend(sent_at - result.point_ms for result in admitted)

    def close(self) -> None:
        if self.engine is not None:
            self.recorder.points = self.engine.considered
        self.recorder.dump("lease")
        super().close()


class MeasuredStockScheduler(PersistentScheduler):  # type: ignore[misc]
    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.recorder = _Recorder()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self.recorder.ticks += 1
        return float(super().tick(*args, **kwargs))

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        due = entry.last_run_at.timestamp() + entry.schedule.run_every.total_seconds()
        super().apply_entry(entry, producer=producer)
        if entry.name.startswith("job"):  # measured after the publish, as for the lease one
            self.recorder.lateness_ms.append(time.time() * 1000 - due * 1000)
            self.recorder.points += 1

    def close(self) -> None:
        self.recorder.dump("stock")
        super().close()


INTERVALS = (5, 10, 15, 20, 30)

if os.environ.get("BENCH_STOCK") == "1":
    app.conf.beat_schedule = {
        f"job{i:05d}": {
            "task": "bench.noop",
            "schedule": timedelta(seconds=INTERVALS[i % len(INTERVALS)]),
        }
        for i in range(int(os.environ.get("BENCH_JOBS", "5000")))
    }
    app.conf.beat_scheduler = "bench.beat_app:MeasuredStockScheduler"
else:
    app.conf.beat_scheduler = "bench.beat_app:MeasuredLeaseScheduler"
