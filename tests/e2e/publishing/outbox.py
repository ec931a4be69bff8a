"""Shared pieces of the outbox end-to-end tests: the producer, the worker, the accounting."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.outbox_app import TABLES_SQL, TASK
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, platform_env, worker_argv


def effect(key: str, **data: Any) -> dict[str, Any]:
    return {"job_id": str(uuid7()), "tenant_id": "t1", "kind": TASK, "data": {"key": key, **data}}


def prepare(database_url: str) -> None:
    query(database_url, TABLES_SQL)
    query(database_url, "TRUNCATE public.outbox_effects, public.outbox_runs")


def applied(database_url: str) -> dict[str, int]:
    rows = query(
        database_url, "SELECT job_id::text, count(*) FROM public.outbox_effects GROUP BY 1"
    )
    return {job: int(n) for job, n in rows}


def outbox_rows(database_url: str) -> int:
    return int(query(database_url, "SELECT count(*) FROM core.outbox")[0][0])


@contextmanager
def producer(
    broker_url: str, redis_url: str, database_url: str, **extra: Any
) -> Iterator[QueuePort]:
    settings = PlatformSettings.build(
        redis_url=redis_url,
        broker_url=broker_url,
        database_url=database_url,
        profile="test",
        **extra,
    )
    app = create_app("outbox_producer", settings=settings)
    port = QueuePort(app)
    try:
        yield port
    finally:
        port.close()
        app.close()


def start_worker(
    started: list[CeleryProcess],
    redis_url: str,
    database_url: str,
    log: Path,
    argv: list[str] | None = None,
    /,
    **extra: str,
) -> CeleryProcess:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
            **extra,
        },
    )
    worker = CeleryProcess(
        argv or worker_argv("tests.apps.outbox_app", concurrency=2),
        env=env,
        cwd=REPO_ROOT,
        log_path=log,
    ).start()
    started.append(worker)
    worker.wait_for_log("ready.", timeout=60)
    return worker


def broker_lists(client: redis.Redis) -> dict[str, int]:
    """Every non-empty Redis list (queues, priority lists)."""
    found = {}
    for key in client.scan_iter(count=1000):
        if client.type(key) == b"list":
            found[key.decode(errors="replace")] = int(client.llen(key))
    return {key: n for key, n in found.items() if n}


def wait_for(
    condition: Any, *, timeout: float, message: str, worker: CeleryProcess, interval: float = 0.2
) -> None:
    """``wait_until`` that shows the worker's log tail at the deadline."""
    try:
        wait_until(condition, timeout=timeout, interval=interval, message=message)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- worker log tail ---\n{worker.log()[-6000:]}") from exc
