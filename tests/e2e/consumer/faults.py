"""Shared pieces of the consumer fault tests: servers, worker, producer and the accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.envelope import uuid7
from platform_tasks.keys import delay_keys
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.fault_app import EFFECTS_TABLE_SQL, QUEUE, TASK
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, platform_env, worker_argv

PROFILE = "test"
"""The profile every process of these tests runs with (``platform_env`` sets it too)."""


def count(database_url: str, table: str) -> int:
    return int(query(database_url, f"SELECT count(*) FROM {table}")[0][0])


def prepare_effects(database_url: str) -> None:
    query(database_url, EFFECTS_TABLE_SQL)
    query(database_url, "TRUNCATE public.effects")


def start_worker(
    started: list[CeleryProcess],
    *,
    redis_url: str,
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    concurrency: int = 2,
) -> CeleryProcess:
    """A real ``celery worker -P prefork`` of the fault app, ready to consume."""
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            # short, so a message whose ack was lost with the broker comes back within the test
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
            **(extra_env or {}),
        },
    )
    argv = worker_argv("tests.apps.fault_app", concurrency=concurrency)
    proc = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=log_path).start()
    started.append(proc)
    proc.wait_for_log("ready.", timeout=60)
    return proc


@contextmanager
def producer(redis_url: str, database_url: str) -> Iterator[tuple[PlatformCelery, QueuePort]]:
    """An app and queue port publishing to ``redis_url`` as application code would."""
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile=PROFILE
    )
    app = create_app("faults_producer", settings=settings)
    port = QueuePort(app)
    try:
        yield app, port
    finally:
        port.close()
        app.close()


def effect_payload(job_id: str | None = None, **data: Any) -> dict[str, Any]:
    return {"job_id": job_id or str(uuid7()), "tenant_id": "tenant-1", "kind": TASK, "data": data}


def publish_all(port: QueuePort, payloads: Sequence[dict[str, Any]]) -> None:
    for payload in payloads:
        port.publish(QUEUE, payload)


def broker_lists(client: redis.Redis) -> dict[str, int]:
    """Every non-empty Redis list (queues, priority lists, anything a transport keeps)."""
    lists = {}
    for key in client.scan_iter(count=1000):
        if client.type(key) == b"list":
            lists[key.decode(errors="replace")] = int(client.llen(key))
    return lists


def delays_pending(client: redis.Redis) -> int:
    return DelayStore(client, delay_keys(PROFILE)).pending()


def wait_for(
    condition: Any,
    *,
    timeout: float,
    message: str,
    worker: CeleryProcess,
    describe: Callable[[], object] | None = None,
) -> None:
    """``wait_until`` that shows the state and the worker's log tail at the deadline."""
    try:
        wait_until(condition, timeout=timeout, interval=0.2, message=message)
    except TimeoutError as exc:
        state = f"\n--- state ---\n{describe()}" if describe is not None else ""
        raise AssertionError(
            f"{exc}{state}\n--- worker log tail ---\n{worker.log()[-6000:]}"
        ) from exc


def duplicated_effects(database_url: str) -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT job_id::text, count(*) FROM public.effects GROUP BY job_id HAVING count(*) > 1",
    )


def job_ids(database_url: str, sql: str, *params: Any) -> list[str]:
    return [row[0] for row in query(database_url, sql, *params)]
