"""A real ``celery -A app beat`` with ``PLATFORM_METRICS_PORT`` serves the beat and delay
metrics: points admitted per replica, the admission latency histogram and the delayed
jobs waiting in the store, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import re
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import free_port, wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

APP = "tests.apps.jobs_app"
JOB = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    pass

define_job(handler=run, interval=timedelta(seconds=1))
"""


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_beat_serves_point_and_delay_metrics(tmp_path: Path, redis_url: str) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "tick.py").write_text(JOB)
    port = free_port()
    env = platform_env(
        redis_url=redis_url,
        database_url=None,
        extra={
            "PLATFORM_JOBS_DIR": str(jobs),
            "PLATFORM_METRICS_PORT": str(port),
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    queue_port = QueuePort(
        create_app(
            "e2e_metrics", settings=PlatformSettings.build(redis_url=redis_url, profile="test")
        )
    )
    later = datetime.now(UTC) + timedelta(hours=1)
    for n in range(2):
        queue_port.schedule(
            "default", {"tenant_id": "t", "kind": "tests.record", "data": {"n": n}}, later
        )
    with celery_processes() as started:
        beat = CeleryProcess(
            [CELERY, "-A", APP, "beat", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)
        beat.wait_for_log("beat scheduler ready", timeout=90)
        owner = re.search(r"beat scheduler ready owner=(\S+)", beat.log())
        assert owner, beat.log()
        replica = (("replica", owner.group(1)),)

        def admitted_twice() -> bool:
            return scrape(port).get(("platform_beat_points_admitted_total", replica), 0) >= 2

        wait_until(admitted_twice, timeout=60, message="two admitted points in /metrics")
        metrics = scrape(port)
        wait_until(
            lambda: scrape(port).get(("platform_delay_entries_waiting", ())) == 2,
            timeout=30,
            message="the two delayed jobs counted as waiting",
        )
        beat.stop(timeout=20)
    queue_port.close()

    assert metrics[("platform_beat_admission_latency_seconds_count", replica)] >= 2
    assert metrics[("platform_beat_admission_latency_seconds_sum", replica)] >= 0
    assert metrics[("platform_delay_promotion_lag_seconds", ())] == 0
