"""Shutdown of a real prefork worker and a real beat with scheduled jobs.

Worker: SIGTERM stops consuming, requests cancellation of running handlers (prefork
children get SIGUSR2), waits at most ``PLATFORM_JOBS_SHUTDOWN_BUDGET_SECONDS``, kills a
handler that ignores cancellation, releases the leases of both runs and exits.
Beat: SIGTERM stops triggering, gives back leases of admitted points it did not send,
and closes.
"""

from __future__ import annotations

import base64
import json
import signal
import time
from pathlib import Path

import redis

from platform_tasks import create_app
from platform_tasks.jobs.leases import JobLeases, resolve_namespace
from platform_tasks.jobs.worker import RUN_TASK
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)

REPO = Path(__file__).resolve().parents[3]
APP = "tests.apps.jobs_app"
BUDGET_SECONDS = 3.0
# Celery's own teardown after our step (pool join, connections); generous for 2 shared cores.
TEARDOWN_SECONDS = 6.0

RECORD = """
import json, os, threading, time
from datetime import timedelta
from platform_tasks.jobs import define_job

def record(ctx, event, **extra):
    with open(os.environ["E2E_RUNS_FILE"], "a") as out:
        out.write(json.dumps(dict(job=ctx.name, event=event, pid=os.getpid(), t=time.time(),
                                  **extra)) + "\\n")
"""

COOPERATIVE = (
    RECORD
    + """
def run(ctx):
    record(ctx, "start")
    cancelled = ctx.cancel_requested.wait(120)
    record(ctx, "end", cancelled=cancelled)

define_job(handler=run, interval=timedelta(hours=1), lease_ttl=timedelta(minutes=10))
"""
)

STUBBORN = (
    RECORD
    + """
def run(ctx):
    record(ctx, "start")
    threading.Event().wait(120)  # ignores ctx.cancel_requested
    record(ctx, "end", cancelled=ctx.cancel_requested.is_set())

define_job(handler=run, interval=timedelta(hours=1), lease_ttl=timedelta(minutes=10))
"""
)

QUICK = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    pass

define_job(handler=run, interval=timedelta(seconds={interval}))
"""


def read_runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leases_for(url: str, client: redis.Redis) -> JobLeases:
    settings = PlatformSettings.build(redis_url=url, profile="test")
    namespace, prefix = resolve_namespace(settings, app_name="jobs_app", mode="live")
    return JobLeases(client, namespace=namespace, prefix=prefix)


def test_worker_sigterm_cancels_kills_after_budget_and_releases_leases(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    jobs_root = tmp_path / "jobs"
    jobs_root.mkdir()
    (jobs_root / "cooperative.py").write_text(COOPERATIVE)
    (jobs_root / "stubborn.py").write_text(STUBBORN)
    runs_file = tmp_path / "runs.jsonl"
    env = platform_env(
        redis_url=redis_url,
        database_url=None,
        extra={
            "PLATFORM_JOBS_DIR": str(jobs_root),
            "E2E_RUNS_FILE": str(runs_file),
            "PLATFORM_JOBS_SHUTDOWN_BUDGET_SECONDS": str(BUDGET_SECONDS),
        },
    )
    leases = leases_for(redis_url, redis_client)
    app = create_app(
        "jobs_app", settings=PlatformSettings.build(redis_url=redis_url, profile="test")
    )

    with celery_processes() as started:
        argv = worker_argv(APP, concurrency=2)
        worker = CeleryProcess(argv, env=env, cwd=REPO, log_path=tmp_path / "worker.log").start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)

        # Admit the current hour's point of both jobs with the real script, and send the
        # triggers exactly as beat does.
        hour = 3_600_000
        now_ms = int(redis_client.time()[0]) * 1000
        point = now_ms // hour * hour
        tokens = {}
        for job in ("cooperative", "stubborn"):
            tokens[job] = f"e2e:{job}"
            admission = leases.admit(
                job,
                point_ms=point,
                period_end_ms=point + hour,
                token=tokens[job],
                lease_ttl_ms=600_000,
            )
            assert admission.outcome.value == "admitted"
            app.send_task(
                RUN_TASK,
                queue="platform.jobs",
                kwargs={
                    "job": job,
                    "point_ms": point,
                    "period_end_ms": point + hour,
                    "token": tokens[job],
                    "lease_ttl_ms": 600_000,
                },
            )

        def both_started() -> bool:
            return {r["job"] for r in read_runs(runs_file) if r["event"] == "start"} == set(tokens)

        wait_until(both_started, timeout=60, message="both handlers running")
        assert {job: leases.lease_holder(job) for job in tokens} == tokens
        children = set(worker.children())
        handler_pids = {r["pid"] for r in read_runs(runs_file)}
        assert handler_pids <= children

        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.popen is not None
        worker.popen.wait(timeout=BUDGET_SECONDS + TEARDOWN_SECONDS + 30)
        elapsed = time.monotonic() - signalled
        log = worker.log()
    app.close()

    runs = read_runs(runs_file)
    ends = {r["job"]: r for r in runs if r["event"] == "end"}
    # the cooperative handler saw the cancellation and returned on its own
    assert ends.get("cooperative", {}).get("cancelled") is True, log[-4000:]
    # the stubborn one never finished: its pool process was killed after the budget
    assert "stubborn" not in ends
    assert "jobs.shutdown_killed" in log or "killed after the shutdown budget" in log, log[-4000:]
    # within the budget (plus Celery's own teardown), not after the 120 s handler
    assert elapsed < BUDGET_SECONDS + TEARDOWN_SECONDS, (elapsed, log[-4000:])
    # both leases given back
    assert {job: leases.lease_holder(job) for job in tokens} == {job: None for job in tokens}
    # the markers stay: the points are consumed, not run again
    assert leases.marker("cooperative") == point and leases.marker("stubborn") == point


def test_worker_cold_shutdown_kills_running_jobs_and_releases_their_leases(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """SIGQUIT is Celery's cold shutdown (``WorkController.terminate``): no budget is
    waited for, the pool's children are killed, and the leases of the jobs they ran are
    given back so the next point is not blocked for ``lease_ttl`` (10 minutes here)."""
    jobs_root = tmp_path / "jobs"
    jobs_root.mkdir()
    (jobs_root / "stubborn.py").write_text(STUBBORN)
    runs_file = tmp_path / "runs.jsonl"
    env = platform_env(
        redis_url=redis_url,
        database_url=None,
        extra={
            "PLATFORM_JOBS_DIR": str(jobs_root),
            "E2E_RUNS_FILE": str(runs_file),
            "PLATFORM_JOBS_SHUTDOWN_BUDGET_SECONDS": "60",
        },
    )
    leases = leases_for(redis_url, redis_client)
    app = create_app(
        "jobs_app", settings=PlatformSettings.build(redis_url=redis_url, profile="test")
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv(APP, concurrency=1), env=env, cwd=REPO, log_path=tmp_path / "worker.log"
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        hour = 3_600_000
        point = int(redis_client.time()[0]) * 1000 // hour * hour
        token = "e2e:cold"
        admission = leases.admit(
            "stubborn",
            point_ms=point,
            period_end_ms=point + hour,
            token=token,
            lease_ttl_ms=600_000,
        )
        assert admission.outcome.value == "admitted"
        app.send_task(
            RUN_TASK,
            queue="platform.jobs",
            kwargs={
                "job": "stubborn",
                "point_ms": point,
                "period_end_ms": point + hour,
                "token": token,
                "lease_ttl_ms": 600_000,
            },
        )
        wait_until(
            lambda: any(r["event"] == "start" for r in read_runs(runs_file)),
            timeout=60,
            message="handler running",
        )
        assert leases.lease_holder("stubborn") == token
        (handler_pid,) = {r["pid"] for r in read_runs(runs_file)}
        worker.signal(signal.SIGQUIT)
        assert worker.popen is not None
        worker.popen.wait(timeout=TEARDOWN_SECONDS + 30)
        log = worker.log()
    app.close()
    assert not any(r["event"] == "end" for r in read_runs(runs_file)), "handler finished?"
    assert not Path(f"/proc/{handler_pid}").exists() or _is_zombie(handler_pid)
    assert "job stubborn killed by a cold shutdown; lease released" in log, log[-4000:]
    assert leases.lease_holder("stubborn") is None, log[-4000:]
    assert leases.marker("stubborn") == point, "the point is consumed, not run again"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def queued_tokens(client: redis.Redis, queue: str) -> set[str]:
    tokens = set()
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _, kwargs, _ = json.loads(body)
        tokens.add(kwargs["token"])
    return tokens


def test_beat_sigterm_stops_triggering_releases_unsent_leases_and_closes(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    jobs_root = tmp_path / "jobs"
    jobs_root.mkdir()
    for i in range(20):
        (jobs_root / f"quick_{i:02d}.py").write_text(QUICK.format(interval=1 + i % 2))
    env = platform_env(
        redis_url=redis_url, database_url=None, extra={"PLATFORM_JOBS_DIR": str(jobs_root)}
    )
    leases = leases_for(redis_url, redis_client)
    names = [f"quick_{i:02d}" for i in range(20)]

    with celery_processes() as started:
        beat = CeleryProcess(
            [
                CELERY,
                "-A",
                APP,
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(tmp_path / "beat-schedule"),
            ],
            env=env,
            cwd=REPO,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)
        beat.wait_for_log("beat scheduler ready", timeout=90)
        # several ticks' worth of triggers (nothing consumes them)
        wait_until(
            lambda: redis_client.llen("platform.jobs") >= 40, timeout=30, message="triggers sent"
        )

        signalled_ms = int(redis_client.time()[0]) * 1000 + 1000
        beat.signal(signal.SIGTERM)
        assert beat.popen is not None
        code = beat.popen.wait(timeout=20)
        log = beat.log()

    assert code == 0, log[-4000:]
    assert "beat scheduler closed" in log, log[-4000:]
    # stopped triggering: no point admitted after the signal (markers frozen)
    markers = {name: leases.marker(name) for name in names}
    assert all(m is not None and m <= signalled_ms for m in markers.values()), markers
    # every lease still held belongs to a trigger that was sent; none is left orphaned
    sent = queued_tokens(redis_client, "platform.jobs")
    held = {name: leases.lease_holder(name) for name in names}
    assert {token for token in held.values() if token is not None} <= sent
