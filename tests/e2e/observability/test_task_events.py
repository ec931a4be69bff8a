"""Task events from a real worker reach Flower and event receivers, none lost.

The worker is ``celery -A tests.apps.events_app worker`` (prefork, as the README runs
it); Flower is ``celery -A tests.apps.events_app flower`` on loopback, as docker-compose
runs it. Flower's HTTP API refuses requests without authentication unless
``FLOWER_UNAUTHENTICATED_API`` is set, so the Flower test sets it (Flower's own switch;
the web pages need nothing).
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import free_port, wait_until
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)

REPO = Path(__file__).resolve().parents[3]
APP = "tests.apps.events_app"
JOBS = 5000
FAILING_EVERY = 100
# Lists the held job of tests/apps/events_app.py reports on and waits on.
HOLDING_KEY = "test:events:holding"
RELEASE_KEY = "test:events:release"


class EventLog:
    """A real Celery event receiver in a thread, keeping every task event by job id."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.events: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        if "uuid" in event:
            with self._lock:
                self.events.setdefault(event["uuid"], []).append(event)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def types(self, job_id: str) -> list[str]:
        with self._lock:
            return [event["type"] for event in self.events.get(job_id, [])]

    def start(self, client: redis.Redis) -> EventLog:
        before = int(client.execute_command("PUBSUB", "NUMPAT"))
        self._thread.start()
        wait_until(
            lambda: int(client.execute_command("PUBSUB", "NUMPAT")) > before,
            timeout=30,
            message="event receiver subscribed",
        )
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)


@contextmanager
def event_log(app: Any, client: redis.Redis) -> Iterator[EventLog]:
    log = EventLog(app).start(client)
    try:
        yield log
    finally:
        log.stop()


def _flower_tasks(port: int) -> dict[str, dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/tasks?limit={JOBS * 2}"
    with urllib.request.urlopen(url, timeout=30) as response:
        tasks: dict[str, dict[str, Any]] = json.load(response)
    return tasks


def test_flower_shows_every_job_of_5000_with_its_final_state(
    settings: PlatformSettings, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """Every job id is in Flower's ``/api/tasks`` with state, kind, tenant and runtime."""
    env = platform_env(redis_url=redis_url, database_url=database_url)
    port = free_port()
    flower_env = dict(env, FLOWER_UNAUTHENTICATED_API="true")
    flower_argv = [CELERY, "-A", APP, "flower", f"--port={port}", "--address=127.0.0.1"]
    with celery_processes() as started:
        flower = CeleryProcess(
            flower_argv, env=flower_env, cwd=REPO, log_path=tmp_path / "flower.log"
        ).start()
        started.append(flower)
        client = redis.Redis.from_url(redis_url)
        # Flower subscribes to the event exchange once it is up; events before that are lost.
        wait_until(
            lambda: int(client.execute_command("PUBSUB", "NUMPAT")) > 0,
            timeout=90,
            message=f"flower subscribed to events\n{flower.log()[-2000:]}",
        )
        worker = CeleryProcess(
            worker_argv(APP), env=env, cwd=REPO, log_path=tmp_path / "worker.log"
        ).start()
        started.append(worker)
        app = create_app("events-publisher", settings=settings)
        port_ = QueuePort(app)
        expected: dict[str, tuple[str, str, str]] = {}
        for n in range(JOBS):
            failing = n % FAILING_EVERY == 0
            kind = "tests.events.broken" if failing else "tests.events.done"
            tenant = f"tenant-{n % 7}"
            job_id = str(port_.publish("default", {"tenant_id": tenant, "kind": kind, "data": {}}))
            expected[job_id] = (kind, tenant, "FAILURE" if failing else "SUCCESS")

        def all_final() -> bool:
            if not worker.running:
                raise AssertionError(f"worker exited:\n{worker.log()[-3000:]}")
            tasks = _flower_tasks(port)
            return all(tasks.get(job, {}).get("state") == want[2] for job, want in expected.items())

        wait_until(
            all_final, timeout=240, interval=1.0, message="every job in Flower with its final state"
        )
        tasks = _flower_tasks(port)
        for job_id, (kind, tenant, state) in expected.items():
            task = tasks[job_id]
            assert task["uuid"] == job_id
            assert task["state"] == state, (job_id, task)
            assert task["name"] == kind, (job_id, task)
            assert f"tenant={tenant} kind={kind}" in task["args"], (job_id, task["args"])
            assert task["worker"].startswith("w1@"), task
            assert task["received"] and task["started"], (job_id, task)
            if state == "SUCCESS":
                assert task["runtime"] is not None and task["runtime"] >= 0, (job_id, task)
            else:
                assert "fails on purpose" in (task["exception"] or ""), (job_id, task)


def test_last_task_succeeded_event_is_published_on_warm_shutdown(
    settings: PlatformSettings, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """A job finishing during warm shutdown (SIGTERM) still reaches an event receiver.

    The worker's flush timer is set far beyond the test (``TEST_EVENTS_FLUSH_INTERVAL``,
    read by the test app), so the job's events can only go out through the flush when
    the consumer stops; with the default 0.1 s timer a pass could be luck of timing.
    """
    env = platform_env(
        redis_url=redis_url, database_url=database_url, extra={"TEST_EVENTS_FLUSH_INTERVAL": "600"}
    )
    client = redis.Redis.from_url(redis_url)
    app = create_app("events-receiver", settings=settings)
    with event_log(app, client) as events, celery_processes() as started:
        worker = CeleryProcess(
            worker_argv(APP), env=env, cwd=REPO, log_path=tmp_path / "worker.log"
        ).start()
        started.append(worker)
        port = QueuePort(app)
        last = str(
            port.publish("default", {"tenant_id": "t1", "kind": "tests.events.held", "data": {}})
        )
        wait_until(
            lambda: client.lindex(HOLDING_KEY, 0) == last.encode(),
            timeout=90,
            message="held job running",
        )
        wait_until(
            lambda: "task-sent" in events.types(last),
            timeout=30,
            message="the publisher's task-sent",
        )
        assert events.types(last) == ["task-sent"], "the worker's events wait for the timer"
        worker.signal(signal.SIGTERM)
        worker.wait_for_log("Warm shutdown", timeout=30)
        client.rpush(RELEASE_KEY, "go")
        assert worker.popen is not None
        assert worker.popen.wait(timeout=60) == 0, worker.log()[-3000:]
        wait_until(
            lambda: "task-succeeded" in events.types(last),
            timeout=30,
            message=f"task-succeeded of {last} after warm shutdown; saw {events.types(last)}",
        )
        assert events.types(last) == [
            "task-sent",
            "task-received",
            "task-started",
            "task-succeeded",
        ], events.types(last)
