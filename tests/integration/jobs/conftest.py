"""Job folders written per test, and the job_scheduler fixture bound to the test Redis."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def job_scheduler_redis_url(redis_url: str) -> str:
    return redis_url


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Callable[[dict[str, str]], Path]:
    """Write ``{relative path: source}`` into a fresh folder and return the folder."""

    def write(files: dict[str, str]) -> Path:
        root = tmp_path / "beat_schedules"
        for relative, source in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        root.mkdir(exist_ok=True)
        return root

    return write


RECORDING_JOB = """
from datetime import timedelta
import redis, os, json
from platform_tasks.jobs import define_job

def run(ctx):
    client = redis.Redis.from_url({url!r})
    client.rpush("test:runs", json.dumps({{"job": ctx.name,
                 "point": ctx.scheduled_for.isoformat()}}))
    client.close()

job = define_job(handler=run, {schedule})
"""
