"""A plain Celery app for the chord reference of bench/batches.py: ``chord`` of
``child`` tasks with a ``done`` callback that stamps its time in Redis."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

URL = os.environ["BENCH_REDIS_URL"]
app = Celery("bench_chord", broker=URL, backend=URL)
app.conf.update(task_default_queue="bench_chord", worker_prefetch_multiplier=4)


@app.task(name="bench.chord.child")
def child(n: int) -> int:
    return n


@app.task(name="bench.chord.done")
def done(results: list[int]) -> None:
    client = redis.Redis.from_url(URL)
    client.set("bench:chord:done", f"{time.time()} {len(results)}")
