"""The stall watchdog in a real ``celery worker`` (started as the README says): a batch
whose children stop ending raises one alert from the worker, naming how many children
are waiting (on a queue nobody consumes), delayed (in the delay store), running (asked
of the worker itself) and dead; once a child ends and the batch stalls again, a second
alert says the running one is gone. ``platform-tasks batches show`` agrees.

The stall time is 2 s here (``PLATFORM_BATCH_STALL_SECONDS``): the test waits for the
alert's log line, with a deadline; the one-alert-per-stall rule across passes and
watchdogs is driven pass by pass in ``tests/integration/batches/test_watchdog.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2

from platform_tasks.testing.servers import wait_until
from tests.apps.stall_app import FAIL, HOLD, QUEUE, TABLES_SQL
from tests.conftest import REPO_ROOT
from tests.e2e.publishing.outbox import producer
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

CLI = str(Path(sys.executable).parent / "platform-tasks")
PARKED = "stall_parked"  # no worker consumes it: its child waits


def _alerts(worker: CeleryProcess) -> list[str]:
    return re.findall(r"alert: (batch \S+ \(stall e2e\) has made no progress.*)", worker.log())


def test_a_stalled_batch_is_alerted_once_per_stall_by_a_worker_naming_where_children_are(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    query(database_url, TABLES_SQL)
    query(database_url, "TRUNCATE public.stall_hold")
    query(database_url, "INSERT INTO public.stall_hold VALUES ('hold until released')")
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_BATCH_STALL_SECONDS": "2",
            "PLATFORM_BATCH_WATCH_INTERVAL_SECONDS": "0.2",
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    with celery_processes() as started, producer(redis_url, redis_url, database_url) as port:
        worker = CeleryProcess(
            worker_argv("tests.apps.stall_app", concurrency=2), env=env, cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()  # fmt: skip
        started.append(worker)
        worker.wait_for_log("ready.", timeout=60)
        conn = psycopg2.connect(database_url)
        with conn, conn.cursor() as cur, port.batch(description="stall e2e", tx=cur) as batch:
            batch.publish(QUEUE, {"tenant_id": "acme", "kind": HOLD, "data": {}})
            batch.publish(QUEUE, {"tenant_id": "acme", "kind": FAIL, "data": {}})
            batch.schedule(
                QUEUE,
                {"tenant_id": "globex", "kind": HOLD, "data": {}},
                datetime.now(UTC) + timedelta(hours=1),
            )
            batch.publish(PARKED, {"tenant_id": "initech", "kind": HOLD, "data": {}})
        conn.close()

        wait_until(lambda: _alerts(worker), timeout=60, message="the stall alert")
        [first] = _alerts(worker)
        assert first.startswith(f"batch {batch.id} (stall e2e) has made no progress")
        assert (
            "3 children outstanding: 1 waiting, 1 delayed, 1 running, 1 dead; "
            f"see platform-tasks batches show {batch.id}"
        ) in first

        shown = subprocess.run(
            [CLI, "batches", "show", str(batch.id), "--json", "--app", "tests.apps.stall_app"],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        detail = json.loads(shown.stdout)
        assert detail["places"] == {
            "waiting": 1,
            "delayed": 1,
            "running": 1,
            "dead": 1,
            "unknown": [],
            "unlocated": 0,
        }
        assert detail["counts"]["dead_lettered"] == 1
        assert detail["stall_alerted_at"] is not None

        # the held child ends: progress; the batch stalls again without it running
        query(database_url, "DELETE FROM public.stall_hold")
        wait_until(lambda: len(_alerts(worker)) >= 2, timeout=60, message="the second stall")
        second = _alerts(worker)[1]
        assert "2 children outstanding: 1 waiting, 1 delayed, 0 running, 1 dead" in second
    assert len(_alerts(worker)) == 2
