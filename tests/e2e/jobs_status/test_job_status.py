"""Every state ``jobs show`` answers, produced for real and answered by the library, the
CLI and the console (headless Chromium), in one run of one worker and one console.

Before the worker starts: a job committed to the outbox (no relay yet), a job on a
paused queue, a scheduled job, a cancelled one (``jobs cancel`` sweeps it from the delay
store). Then the worker applies a job with recorded output, dead-letters a permanent
failure and an output over the cap, schedules a retry, runs a job that reports progress
(and holds a concurrency slot, so the next job of its tenant waits on the cap), and
throttles the second job of a tenant. 200 jobs of another correlation id are spread over
three queues (one consumed, one paused, one nobody consumes) and listed with their states.

The worker is started with ``-Q status,status_paused``, unlike the README's command: a
third queue that no worker consumes is what keeps jobs ``waiting`` for the test to find,
and a worker without ``-Q`` would consume every queue the test app declares.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from platform_tasks.app import platform_queue_port
from platform_tasks.envelope import uuid7
from platform_tasks.jobs_status import JobStatus, StatusReader
from platform_tasks.operations import pause_queue
from platform_tasks.publishing.queue_port import QueuePort
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.support.console import (
    CLI,
    OPERATOR,
    VIEWER,
    console_database,
    headless_chromium,
    running_console,
)
from tests.support.operations import REPO_ROOT
from tests.support.processes import (
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)

APP = "tests.apps.status_app:app"
QUEUES = ("status", "status_paused", "status_idle")
WORK, CAPPED, THROTTLED = "tests.status.work", "tests.status.capped", "tests.status.throttled"


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    url = console_database(postgres_server)
    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("TRUNCATE core.processed_jobs, core.outbox, core.delivery_marks")
    conn.close()
    return url


class Jobs:
    """Publishes the test's jobs under one correlation id and remembers their ids."""

    def __init__(self, port: QueuePort, correlation_id: str) -> None:
        self.port = port
        self.correlation_id = correlation_id
        self.ids: dict[str, str] = {}

    def envelope(self, kind: str, tenant: str, **data: Any) -> dict[str, Any]:
        return {
            "job_id": str(uuid7()),
            "tenant_id": tenant,
            "correlation_id": self.correlation_id,
            "kind": kind,
            "data": data,
        }

    def publish(
        self,
        name: str,
        kind: str = WORK,
        *,
        queue: str = "status",
        tenant: str = "t1",
        tx: Any = None,
        **data: Any,
    ) -> str:
        self.ids[name] = str(self.port.publish(queue, self.envelope(kind, tenant, **data), tx=tx))
        return self.ids[name]

    def schedule(self, name: str, *, tenant: str = "t1") -> str:
        later = datetime.now(UTC) + timedelta(hours=1)
        self.ids[name] = str(self.port.schedule("status", self.envelope(WORK, tenant), later))
        return self.ids[name]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _cli_json(env: dict[str, str], *args: str) -> Any:
    result = _cli(env, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _state_is(reader: StatusReader, job_id: str, state: str) -> bool:
    return reader.job(job_id).state == state


def _before_the_worker(
    jobs: Jobs, settings: PlatformSettings, reader: StatusReader, env: dict[str, str], database: str
) -> None:
    conn = psycopg2.connect(database)
    with conn:  # committed in the publisher's transaction; no relay runs yet
        outbox = jobs.publish("outbox", tx=conn)
    conn.close()
    status = reader.job(outbox)
    assert (status.state, status.details["reason"]) == ("delayed", "outbox")
    assert status.details["queue"] == "status"

    pause_queue(settings, "status_paused", actor="tester")
    paused = reader.job(jobs.publish("paused", queue="status_paused"))
    assert paused.state == "waiting"
    assert paused.details["queue"] == "status_paused"
    assert paused.details["paused"]["actor"] == "tester"
    assert paused.details["waited_seconds"] >= 0

    scheduled = reader.job(jobs.schedule("scheduled"))
    assert (scheduled.state, scheduled.details["reason"]) == ("delayed", "scheduled")
    due = datetime.fromisoformat(scheduled.details["due_at"])
    assert timedelta(minutes=59) < due - datetime.now(UTC) <= timedelta(hours=1)

    jobs.schedule("cancelled", tenant="gone")
    result = _cli(env, "jobs", "cancel", "--tenant", "gone", "--yes")
    assert result.returncode == 0, result.stderr
    cancelled = reader.job(jobs.ids["cancelled"])
    assert cancelled.state == "cancelled"
    assert cancelled.details["actor"] == "tester"
    assert isinstance(cancelled.details["operation_id"], int)

    never = reader.job(str(uuid7()))
    assert (never.state, never.details["reason"]) == ("unknown", "never_seen")


def _crowd(port: QueuePort, correlation_id: str) -> dict[str, list[str]]:
    """200 jobs of one request over three queues: consumed, paused, consumed by nobody."""
    crowd = Jobs(port, correlation_id)
    placed: dict[str, list[str]] = {queue: [] for queue in QUEUES}
    for index in range(200):
        queue = QUEUES[index % 3]
        placed[queue].append(crowd.publish(f"c{index}", queue=queue, tenant=f"t{index % 7}"))
    return placed


def _produce(jobs: Jobs, reader: StatusReader, client: redis.Redis) -> None:
    jobs.publish("applied", output={"rows": 3, "file": "invoices.csv"})
    jobs.publish("dead", mode="permanent")
    jobs.publish("too_big", mode="big")
    jobs.publish("retrying", mode="fail")
    jobs.publish("running", tenant="r", mode="hold")
    jobs.publish("capped_running", CAPPED, tenant="c", mode="hold")
    wait_until(
        lambda: _state_is(reader, jobs.ids["capped_running"], "running"),
        timeout=60,
        message="the capped job to run",
    )
    jobs.publish("capped_waiting", CAPPED, tenant="c")
    jobs.publish("throttled_first", THROTTLED, tenant="th")
    wait_until(
        lambda: _state_is(reader, jobs.ids["throttled_first"], "applied"),
        timeout=60,
        message="the first throttled job to apply",
    )
    jobs.publish("throttled_second", THROTTLED, tenant="th")


EXPECTED = {
    "outbox": "applied",
    "paused": "waiting",
    "scheduled": "delayed",
    "cancelled": "cancelled",
    "applied": "applied",
    "dead": "dead_lettered",
    "too_big": "dead_lettered",
    "retrying": "delayed",
    "running": "running",
    "capped_running": "running",
    "capped_waiting": "delayed",
    "throttled_first": "applied",
    "throttled_second": "delayed",
}


def _check_library(jobs: Jobs, reader: StatusReader) -> dict[str, JobStatus]:
    def settled() -> bool:
        return all(reader.job(jobs.ids[name]).state == state for name, state in EXPECTED.items())

    wait_until(settled, timeout=90, message="every job to reach its state")
    got = {name: reader.job(job_id) for name, job_id in jobs.ids.items()}
    assert got["applied"].output == {WORK: {"rows": 3, "file": "invoices.csv"}}
    assert got["applied"].details["consumers"][0]["consumer"] == WORK
    assert got["dead"].details["review_status"] == "pending_review"
    assert got["dead"].details["error_type"] == "platform_tasks.errors.PermanentError"
    assert got["too_big"].details["error_type"] == "platform_tasks.errors.OutputRefused"
    retry = got["retrying"].details
    assert (retry["reason"], retry["retry"]) == ("retry", {"attempt": 2, "of": 3})
    assert got["capped_waiting"].details["reason"] == "concurrency_cap"
    assert got["throttled_second"].details["reason"] == "throttle"
    running = got["running"].details
    assert running["attempt"] == 1 and running["consumer"] == WORK and running["pid"] > 0
    wait_until(
        lambda: (reader.job(jobs.ids["running"]).details["progress"] or {}).get("done") == 1000,
        timeout=30,
        message="the progress after the tight loop to be written",
    )
    progress = reader.job(jobs.ids["running"]).details["progress"]
    assert (progress["total"], progress["note"]) == (1000, "rows imported")
    return got


def _check_cli(jobs: Jobs, env: dict[str, str], crowd: dict[str, list[str]], crowd_id: str) -> None:
    listed = _cli_json(env, "jobs", "list", "--correlation-id", jobs.correlation_id, "--json")
    states = {row["job_id"]: row["state"] for row in listed}
    assert states == {jobs.ids[name]: state for name, state in EXPECTED.items()}
    order = [row["job_id"] for row in listed]
    assert order == sorted(order, key=lambda job: uuid.UUID(job).int)  # publish order (UUIDv7)

    shown = _cli_json(env, "jobs", "show", jobs.ids["applied"], "--json")
    assert shown["output"] == {WORK: {"rows": 3, "file": "invoices.csv"}}
    text = _cli(env, "jobs", "show", jobs.ids["running"])
    assert text.returncode == 0, text.stderr
    assert f"job {jobs.ids['running']}: running" in text.stdout
    assert "note: rows imported" in text.stdout

    # a queue no worker declared is searched when named
    many = _cli_json(
        env, "jobs", "list", "--correlation-id", crowd_id, "--queue", "status_idle", "--json"
    )
    assert len(many) == 200
    by_job = {row["job_id"]: row for row in many}
    assert {by_job[job]["state"] for job in crowd["status"]} == {"applied"}
    for queue in ("status_paused", "status_idle"):
        assert {by_job[job]["state"] for job in crowd[queue]} == {"waiting"}
        assert {by_job[job]["details"]["queue"] for job in crowd[queue]} == {queue}
    assert Counter(row["state"] for row in many) == {"applied": 67, "waiting": 133}


def _log_in(web: Any, url: str, username: str, password: str) -> None:
    web.delete_all_cookies()
    web.get(f"{url}/admin/login/")
    web.find_element(By.ID, "id_username").send_keys(username)
    web.find_element(By.ID, "id_password").send_keys(password)
    web.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(web, 30).until(expected_conditions.url_to_be(f"{url}/admin/"))


def _search(web: Any, url: str, text: str) -> dict[str, str]:
    web.get(f"{url}/admin/platform_console/queue/")
    web.find_element(By.ID, "id_find").send_keys(text)
    web.find_element(By.CSS_SELECTOR, "#find-job input[type=submit]").click()
    WebDriverWait(web, 30).until(lambda w: w.find_elements(By.ID, "found-count"))
    rows = web.find_elements(By.CSS_SELECTOR, "#jobs tr.job-row")
    return {row.get_attribute("data-job"): row.get_attribute("data-state") for row in rows}


def _check_console(jobs: Jobs, database: str, redis_url: str, tmp_path: Path) -> None:
    extra = {"PLATFORM_CONSOLE_QUEUES": ",".join(QUEUES)}
    with (
        running_console(database, redis_url, tmp_path / "console.log", extra) as console,
        headless_chromium(tmp_path) as web,
    ):
        try:
            _log_in(web, console.url, *OPERATOR)
            states = _search(web, console.url, jobs.correlation_id)
            assert states == {jobs.ids[name]: state for name, state in EXPECTED.items()}
            assert _search(web, console.url, jobs.ids["applied"]) == {
                jobs.ids["applied"]: "applied"
            }
            assert "invoices.csv" in web.find_element(By.CSS_SELECTOR, "pre.platform-output").text
            _search(web, console.url, jobs.ids["running"])
            assert (
                "1000 of 1000 (rows imported)"
                in web.find_element(By.CSS_SELECTOR, ".progress").text
            )

            _log_in(web, console.url, *VIEWER)
            assert _search(web, console.url, jobs.ids["applied"]) == {
                jobs.ids["applied"]: "applied"
            }
            assert not web.find_elements(By.CSS_SELECTOR, "pre.platform-output")
            assert "invoices.csv" not in web.page_source
            assert web.find_elements(By.CSS_SELECTOR, ".output-hidden")
            assert _search(web, console.url, jobs.ids["dead"]) == {
                jobs.ids["dead"]: "dead_lettered"
            }
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- console log ---\n{console.log()[-4000:]}") from exc


@pytest.fixture
def started() -> Iterator[list[CeleryProcess]]:
    with celery_processes() as processes:
        yield processes


def test_every_state_answered_by_library_cli_and_console(
    database: str, redis_url: str, tmp_path: Path, started: list[CeleryProcess]
) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, database_url=database, profile="test")
    env = platform_env(
        redis_url=redis_url,
        database_url=database,
        extra={
            "PLATFORM_APP": APP,
            "PLATFORM_ACTOR": "tester",
            "PLATFORM_JOB_OUTPUT_MAX_BYTES": "1024",
        },
    )
    client = redis.Redis.from_url(redis_url)
    port = platform_queue_port(settings)
    jobs = Jobs(port, uuid.uuid4().hex)
    crowd_id = uuid.uuid4().hex
    try:
        with StatusReader(settings, queues=QUEUES) as reader:
            _before_the_worker(jobs, settings, reader, env, database)
            crowd = _crowd(port, crowd_id)
            worker = CeleryProcess(
                worker_argv(APP, queues="status,status_paused", concurrency=4),
                env=env,
                cwd=REPO_ROOT,
                log_path=tmp_path / "worker.log",
            ).start()
            started.append(worker)
            worker.wait_for_log("ready.", timeout=120)
            try:
                _produce(jobs, reader, client)
                _check_library(jobs, reader)
            except Exception as exc:
                raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
        _check_cli(jobs, env, crowd, crowd_id)
        _check_console(jobs, database, redis_url, tmp_path)
    finally:
        port.close()
        for name in ("running", "capped_running"):
            if name in jobs.ids:
                client.set(f"test:release:{jobs.ids[name]}", "1")
        client.close()
