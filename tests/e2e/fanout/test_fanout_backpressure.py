"""A fan-out never takes its target queue above ``PLATFORM_FANOUT_MAX_QUEUE_DEPTH``.

Real ``celery -A tests.apps.fanout_app worker`` processes on Redis. They name their queues
with ``-Q``, on purpose: the first worker consumes only ``platform.fanout`` so the
tenants' queue has no consumer at all (the slowest consumer there is) and the fan-out
must stop at the bound; a second worker then consumes the tenants' queue alone with one
process (slower than the fan-out publishes), while a thread samples the queue's length.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import redis

from platform_tasks import QueuePort
from platform_tasks.fanout import FANOUT_QUEUE, fan_out
from platform_tasks.testing.servers import wait_until
from tests.apps.fanout_app import KIND, WORK_QUEUE
from tests.conftest import REPO_ROOT
from tests.support.fanout import (
    applied,
    assert_each_tenant_applied_once,
    ctx,
    make_tenants,
    port,
    progress,
)
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

__all__ = ["make_tenants", "port"]  # fixtures

BOUND = 500
BATCH = 100


class DepthSampler:
    """Reads the queue's length in a loop on its own connection; keeps the largest seen."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.key = key
        self.largest = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.largest = max(self.largest, int(self.client.llen(self.key)))
            self.samples += 1

    def __enter__(self) -> DepthSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()


def _worker(
    env: dict[str, str], tmp_path: Path, name: str, queues: str, concurrency: int
) -> CeleryProcess:
    argv = worker_argv(
        "tests.apps.fanout_app", queues=queues, concurrency=concurrency, hostname=f"{name}@%h"
    )
    return CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / f"{name}.log")


def test_a_fan_out_keeps_its_queue_under_the_bound_while_consumers_are_slow(
    redis_url: str,
    database_url: str,
    make_tenants: Callable[[int], int],
    port: QueuePort,
    tmp_path: Path,
) -> None:
    tenants = make_tenants(3000)
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_FANOUT_BATCH_SIZE": str(BATCH),
            "PLATFORM_FANOUT_MAX_QUEUE_DEPTH": str(BOUND),
            "PLATFORM_JOBS_ENABLED": "false",
        },
    )
    client = redis.Redis.from_url(redis_url)
    with celery_processes() as started, DepthSampler(redis_url, WORK_QUEUE) as sampler:
        fanouts = _worker(env, tmp_path, "fanouts", FANOUT_QUEUE, 1).start()
        started.append(fanouts)
        fanouts.wait_for_log("ready.")
        fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        # no consumer: the fan-out fills the queue to the bound, marks it, and waits
        wait_until(
            lambda: progress(database_url) in ((BOUND, False), (tenants, True)),
            timeout=90,
            message="the fan-out stopped at the bound",
        )
        assert progress(database_url) == (BOUND, False)
        assert client.llen(WORK_QUEUE) == BOUND
        # one slow consumer: the fan-out publishes a batch each time there is room for it
        consumer = _worker(env, tmp_path, "consumer", WORK_QUEUE, 1).start()
        started.append(consumer)
        wait_until(
            lambda: progress(database_url) == (tenants, True),
            timeout=300,
            message="the fan-out finished",
        )
        wait_until(
            lambda: applied(database_url) >= tenants,
            timeout=300,
            message="every tenant job applied",
        )
        wait_until(lambda: client.llen(WORK_QUEUE) == 0, timeout=60, message="queue drained")
    client.close()
    assert sampler.samples > 1000, sampler.samples
    assert sampler.largest == BOUND, f"largest depth seen {sampler.largest}, bound {BOUND}"
    assert_each_tenant_applied_once(database_url, tenants)
