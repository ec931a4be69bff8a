"""Publish and schedule through real worker processes; promoters killed mid-run."""

from __future__ import annotations

import json
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import delay_keys
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv


def _recorded_ids(client: redis.Redis) -> list[str]:
    return [json.loads(raw)["job_id"] for raw in client.lrange("test:recorded", 0, -1)]


def test_publish_and_schedule_reach_a_real_worker(redis_url: str, tmp_path: Path) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("e2e_publisher", settings=settings)
    port = QueuePort(app)
    client = redis.Redis.from_url(redis_url)
    env = platform_env(
        redis_url=redis_url,
        database_url=None,
        extra={"PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1"},
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.basic_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")
        now_id = port.publish("default", {"tenant_id": "t", "kind": "tests.record", "data": {}})
        run_at = datetime.now(UTC) + timedelta(seconds=2)
        later_id = port.schedule(
            "default", {"tenant_id": "t", "kind": "tests.record", "data": {"n": 1}}, run_at
        )
        wait_until(
            lambda: str(now_id) in _recorded_ids(client),
            timeout=30,
            message="published job recorded",
        )
        wait_until(
            lambda: str(later_id) in _recorded_ids(client),
            timeout=30,
            message="delayed job recorded",
        )
        # Judged by when the handler ran (Redis TIME, this machine's clock), not by when
        # the test looked, so a slow worker cannot make the check pass or fail by accident.
        ran_at = {
            job_id.decode(): float(at) for job_id, at in client.hgetall("test:recorded_at").items()
        }
        assert ran_at[str(later_id)] >= run_at.timestamp(), "delayed job ran before run_at"
        log = worker.log()
        assert f"tests.record[{now_id}]" in log, "the Celery task id is the job id"
    assert sorted(_recorded_ids(client)) == sorted([str(now_id), str(later_id)])
    port.close()


def test_ten_thousand_due_at_once_two_promoters_one_killed(server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = server_factory.redis(appendfsync="everysec")
    settings = PlatformSettings.build(redis_url=server.url, profile="test", delay_batch_size=20)
    app = create_app("e2e_delays", settings=settings)
    port = QueuePort(app)
    client = redis.Redis.from_url(server.url)
    store = DelayStore(client, delay_keys("test"))
    env = platform_env(
        redis_url=server.url,
        database_url=None,
        extra={"PLATFORM_DELAY_BATCH_SIZE": "20", "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.05"},
    )
    argv = [sys.executable, "-m", "tests.support.promoter_main"]
    with celery_processes() as started:
        # Both promoters are polling before anything is stored, so how long their start-up
        # takes on a loaded machine cannot let entries fall due (and be promoted) early.
        first = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "p1.log").start()
        second = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "p2.log").start()
        started += [first, second]
        first.wait_for_log("promoter started")
        second.wait_for_log("promoter started")
        # Stored an hour ahead first, however long that takes on a loaded machine, then
        # made due all at once: one ZADD re-times all 10,000 entries atomically to fall
        # due within one second of Redis' clock, so no promoter can start on a half-stored
        # batch.
        seconds, _ = client.time()
        later = datetime.fromtimestamp(seconds + 3600, UTC)
        items = [
            ({"tenant_id": "t", "kind": "tests.record", "data": {"n": n}}, later)
            for n in range(10_000)
        ]
        job_ids = [str(job_id) for job_id in port.schedule_many("bulk", items)]
        assert store.pending() == 10_000
        assert client.llen("bulk") == 0, "nothing is due yet"
        schedule_key = delay_keys("test").schedule
        entry_ids = client.zrange(schedule_key, 0, -1)
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        retimed = {entry: now_ms + n % 1000 for n, entry in enumerate(entry_ids)}
        assert client.zadd(schedule_key, retimed, xx=True, ch=True) == 10_000
        wait_until(
            lambda: client.llen("bulk") > 0, timeout=30, interval=0.001, message="promotion started"
        )
        first.signal(signal.SIGKILL)
        pending_at_kill = store.pending()
        wait_until(lambda: store.pending() == 0, timeout=60, message="all entries promoted")
    ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange("bulk", 0, -1)]
    assert pending_at_kill > 0, "the kill must land while entries were still waiting"
    assert len(ids) == 10_000, f"{len(ids)} messages for 10,000 entries"
    assert sorted(ids) == sorted(job_ids), "every entry delivered exactly once"
    assert client.hlen(delay_keys("test").entries) == 0
    port.close()
