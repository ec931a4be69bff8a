"""Pause and resume a queue across two real workers: the queue's depth stops falling
within 2 s of ``platform-tasks queues pause``, and ``queues resume`` drains it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from platform_tasks.app import platform_queue_port
from platform_tasks.keys import fair_lane_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.operations import APP, REPO_ROOT, Shell, create_applied_table, envelope
from tests.support.processes import CeleryProcess, celery_processes, worker_argv

JOBS = 1500
HONOURED_WITHIN = 2.0
WATCHED_FOR = 2.0


def _depth(client: redis.Redis) -> int:
    """Jobs waiting on ``default``: its list, plus its tenant lanes when the suite runs
    with fairness on (``TEST_FAIR_QUEUES``), where the workers sort the list onto lanes."""
    waiting = client.get(fair_lane_keys("default").waiting)
    return int(client.llen("default")) + max(0, int(waiting or 0))


@pytest.fixture
def shell(redis_url: str, database_url: str) -> Shell:
    create_applied_table(database_url)
    return Shell(redis_url, database_url)


def test_pause_stops_two_workers_within_two_seconds_and_resume_drains(
    shell: Shell, settings: PlatformSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    port = platform_queue_port(settings)
    try:
        for _ in range(JOBS):
            port.publish("default", envelope("t1", sleep=0.02))
    finally:
        port.close()
    with celery_processes() as started:
        workers = [
            CeleryProcess(
                worker_argv(APP, concurrency=2, hostname=f"w{index}@%h"),
                env=shell.env,
                cwd=REPO_ROOT,
                log_path=tmp_path / f"worker{index}.log",
            ).start()
            for index in range(2)
        ]
        started.extend(workers)
        for worker in workers:
            worker.wait_for_log("ready.", timeout=120)
        wait_until(
            lambda: _depth(redis_client) <= JOBS - 100,
            timeout=120,
            message="both workers to be draining the queue",
        )

        paused = shell.run("queues", "pause", "default")
        assert paused.returncode == 0, paused.stderr
        since = time.monotonic()
        # Watch the depth: from HONOURED_WITHIN after the pause on, it must not move.
        samples: list[tuple[float, int]] = []
        while time.monotonic() - since < HONOURED_WITHIN + WATCHED_FOR:
            samples.append((time.monotonic() - since, int(_depth(redis_client))))
            time.sleep(0.05)  # sampling interval of the observation, not a synchronisation
        settled = {depth for at, depth in samples if at >= HONOURED_WITHIN}
        assert len(settled) == 1, f"depth still falling after {HONOURED_WITHIN} s: {samples}"
        (held,) = settled
        assert held > 0
        settled_at = min(at for at, depth in samples if depth == held)
        print(f"depth {held} from {settled_at:.2f} s after the pause returned")
        for worker in workers:
            worker.wait_for_log("queue default paused on this worker", timeout=5)

        listed = shell.run("queues", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        (status,) = [q for q in json.loads(listed.stdout) if q["queue"] == "default"]
        assert status["paused"] is True and status["paused_by"] == "tester"
        assert status["depth"] == held

        resumed = shell.run("queues", "resume", "default")
        assert resumed.returncode == 0, resumed.stderr
        wait_until(
            lambda: _depth(redis_client) == 0,
            timeout=180,
            message="the resumed queue to drain",
        )
        wait_until(
            lambda: shell.scalar("SELECT count(*) FROM public.ops_applied") == JOBS,
            timeout=60,
            message="every job to be applied",
        )
    kinds = shell.query("SELECT kind, actor, done FROM core.operations ORDER BY id")
    assert kinds == [("pause", "tester", 1), ("resume", "tester", 1)]
    assert shell.run("queues", "resume", "default").returncode == 1  # not paused any more
