"""Celery's own task options on PlatformTask, and what task events (Flower) show.

A real ``celery -A tests.e2e.consumer.routing_app worker`` started as users start it (no
``-Q``): it consumes the queues the platform's tasks name. Task events are read with a
real ``app.events.Receiver`` on the same broker, which is what Flower does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.e2e.consumer.routing_app import WORK_TABLE_SQL, runs_key
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

APP = "tests.e2e.consumer.routing_app"
SECRET = "4111-1111-SECRET-DATA"


def job(kind: str, **data: Any) -> dict[str, Any]:
    return {"job_id": str(uuid7()), "tenant_id": "t1", "kind": kind, "data": data}


@pytest.fixture
def producer(settings: PlatformSettings) -> Iterator[tuple[PlatformCelery, QueuePort]]:
    query(str(settings.database_url), WORK_TABLE_SQL)
    query(str(settings.database_url), "TRUNCATE public.routing_work")
    app = create_app("routing_producer", settings=settings)
    port = QueuePort(app)
    yield app, port
    port.close()
    app.close()


@pytest.fixture
def worker(redis_url: str, database_url: str, tmp_path: Path) -> Iterator[CeleryProcess]:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1"},
    )
    with celery_processes() as started:
        proc = CeleryProcess(
            worker_argv(APP, concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(proc)
        proc.wait_for_log("ready.", timeout=60)
        yield proc


def applied(database_url: str, job_id: str) -> list[str]:
    sql = "SELECT task FROM public.routing_work WHERE job_id = %s"
    return [row[0] for row in query(database_url, sql, job_id)]


@pytest.mark.parametrize(
    ("queue", "kind"), [("billing", "billing.charge"), ("ledger", "ledger.post")]
)
def test_retry_of_a_task_on_its_own_queue_goes_back_there_and_runs(
    worker: CeleryProcess,
    producer: tuple[PlatformCelery, QueuePort],
    database_url: str,
    redis_client: redis.Redis,
    queue: str,
    kind: str,
) -> None:
    """``billing`` is the task's own ``queue=`` option; ``ledger``'s routing key differs."""
    _, port = producer
    payload = job(kind, fail_times=1)
    port.publish(queue, payload)
    try:
        wait_until(
            lambda: applied(database_url, payload["job_id"]) == [kind],
            timeout=60,
            interval=0.2,
            message=f"{kind} applied after one retry",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
    assert int(redis_client.get(runs_key(payload["job_id"])) or 0) == 2


def test_task_events_carry_no_payload_data(
    worker: CeleryProcess, producer: tuple[PlatformCelery, QueuePort], database_url: str
) -> None:
    app, port = producer
    events: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": events.append})
        thread = threading.Thread(
            target=lambda: receiver.capture(limit=None, timeout=None), daemon=True
        )
        thread.start()
        try:
            probes: list[str] = []

            def receiving() -> bool:  # events only reach a subscribed receiver
                if any(e.get("uuid") in probes for e in events):
                    return True
                probe = job("ledger.post")
                probes.append(probe["job_id"])
                port.publish("ledger", probe)
                return False

            wait_until(receiving, timeout=60, interval=1.0, message="receiver subscribed")
            returns = job("secrets.leak", secret=SECRET)
            retried = job("secrets.leak", secret=SECRET, fail_times=1)
            failed = job("secrets.leak", secret=SECRET, permanent=True)
            for payload in (returns, retried, failed):
                port.publish("default", payload)

            def types_of(job_id: str) -> set[str]:
                return {e["type"] for e in events if e.get("uuid") == job_id}

            wait_until(
                lambda: (
                    "task-succeeded" in types_of(returns["job_id"])
                    and {"task-retried", "task-succeeded"} <= types_of(retried["job_id"])
                    and "task-failed" in types_of(failed["job_id"])
                ),
                timeout=60,
                interval=0.2,
                message="events of all three jobs",
            )
        finally:
            receiver.should_stop = True
            thread.join(10)
    ours = {returns["job_id"], retried["job_id"], failed["job_id"]}
    leaking = [e for e in events if SECRET in json.dumps(e, default=str)]
    assert leaking == [], leaking
    failure = next(
        e for e in events if e.get("uuid") == failed["job_id"] and e["type"] == "task-failed"
    )
    assert "DeadLettered" in failure["exception"]
    assert "PermanentError" in failure["exception"]
    assert {e.get("uuid") for e in events} >= ours


def test_worker_refuses_a_broker_that_cannot_hold_delays(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Retries are stored as delays: a broker that holds none (kombu's in-memory one) is refused."""
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_BROKER_URL": "memory://guest:hunter2pw@localhost//"},
    )
    with celery_processes() as started:
        proc = CeleryProcess(
            worker_argv(APP, concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(proc)
        try:
            wait_until(
                lambda: not proc.running, timeout=60, interval=0.2, message="the worker exits"
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{proc.log()[-3000:]}") from exc
        log = proc.log()
    assert "PLATFORM_BROKER_URL" in log
    assert "hunter2pw" not in log
