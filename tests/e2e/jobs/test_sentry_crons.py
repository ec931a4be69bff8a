"""Scheduled jobs send Sentry Crons check-ins from a real worker and beat.

``celery -A tests.apps.jobs_app worker`` and ``... beat`` run as the README starts them
(no ``-Q``), with ``SENTRY_DSN`` pointing at a Sentry endpoint on loopback. One job
succeeds, one raises: each run is an ``in_progress`` check-in followed by ``ok`` or
``error`` under the same check-in id, the monitor slug is the job name and the monitor
configuration comes from the definition. The failing handler's exception is one event.

The worker is started with ``-Q platform.jobs``: on Celery 5.7 a worker without ``-Q``
does not add the job queue yet (``platform_tasks.brokers.worker_queues`` takes
``Queues.consume_from``, which Celery 5.7 always returns as a separate dict, for a ``-Q``
selection). Drop the option once that is fixed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)
from tests.support.sentry_receiver import SentryReceiver
from tests.support.sentry_sdk_versions import SDK_MAJORS, sdk_pythonpath, sent_with

APP = "tests.apps.jobs_app"

JOB = """
import os
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    secret = os.environ["E2E_SECRET"]  # a local variable Sentry must never see
    if {fail}:
        raise RuntimeError("the handler failed")

define_job(handler=run, interval=timedelta(seconds=1))
"""


def _pairs(check_ins: list[dict[str, Any]], slug: str) -> dict[str, list[str]]:
    """check_in_id -> statuses, in arrival order, for one monitor."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for check_in in check_ins:
        if check_in["monitor_slug"] == slug:
            by_id[check_in["check_in_id"]].append(check_in["status"])
    return by_id


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_job_runs_send_check_ins_and_one_failure_event(
    redis_url: str, tmp_path: Path, sdk_major: str
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "crons_ok.py").write_text(JOB.format(fail=False))
    (jobs / "crons_fail.py").write_text(JOB.format(fail=True))
    with SentryReceiver() as sentry, celery_processes() as started:
        env = platform_env(
            redis_url=redis_url,
            database_url=None,
            extra={
                "PLATFORM_JOBS_DIR": str(jobs),
                "SENTRY_DSN": sentry.dsn,
                "E2E_SECRET": "token-must-not-leave",
            },
            pythonpath=sdk_pythonpath(sdk_major),
        )
        worker = CeleryProcess(
            worker_argv(APP, concurrency=2),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
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
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)

        def finished(slug: str, status: str) -> bool:
            return any(
                s == ["in_progress", status] for s in _pairs(sentry.check_ins, slug).values()
            )

        try:
            wait_until(
                lambda: finished("crons_ok", "ok") and finished("crons_fail", "error"),
                timeout=90,
                message="ok and error check-in pairs",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{sentry.check_ins}\n{worker.log()[-3000:]}") from exc
        beat.stop(timeout=30)
        worker.stop(timeout=30)  # flushes the worker's Sentry client
        log = worker.log()

    failed_runs = log.count("job crons_fail failed")
    assert failed_runs >= 1
    for slug, final in (("crons_ok", "ok"), ("crons_fail", "error")):
        for check_in_id, statuses in _pairs(sentry.check_ins, slug).items():
            # a run cut short by the worker's shutdown may lack its final check-in
            assert statuses in (["in_progress", final], ["in_progress"]), (check_in_id, statuses)
    for check_in in sentry.check_ins:
        assert check_in["monitor_config"] == {
            "schedule": {"type": "interval", "value": 1, "unit": "minute"},
            "timezone": "UTC",
        }
        if check_in["status"] != "in_progress":
            assert check_in["duration"] >= 0
    assert {sent_with(event) for event in sentry.events} == {sdk_major}
    failures = [e for e in sentry.events if e.get("tags", {}).get("job") == "crons_fail"]
    assert len(failures) == failed_runs, "one event per failed run"
    assert len(sentry.events) == failed_runs, [e.get("logger") for e in sentry.events]
    assert {tuple(e["fingerprint"]) for e in failures} == {
        ("platform-job-failed", "crons_fail", "builtins.RuntimeError")
    }
    text = json.dumps(sentry.events)
    assert "token-must-not-leave" not in text and '"vars"' not in text
