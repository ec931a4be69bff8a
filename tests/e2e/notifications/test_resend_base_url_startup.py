"""A worker refuses to start when ``PLATFORM_RESEND_BASE_URL`` is plain http:// to a host
that is not loopback: every request would carry the API key in clear text.

A real ``celery -A tests.apps.notifications_app worker``, started as the README says; it
must exit with an error naming the setting, never become ready, and not print the key.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.testing.servers import wait_until
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv
from tests.support.resend_server import API_KEY

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_worker_refuses_plain_http_to_a_remote_provider(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_RESEND_API_KEY": API_KEY,
            "PLATFORM_RESEND_BASE_URL": "http://api.resend.com",
        },
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.notifications_app", concurrency=1, hostname="refused@%h"),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        wait_until(
            lambda: not worker.running or "ready." in worker.log(),
            timeout=120,
            message="the worker exiting (or becoming ready)",
        )
        output = worker.log()
        assert "ready." not in output
        assert not worker.running
    assert "PLATFORM_RESEND_BASE_URL" in output
    assert "loopback" in output
    assert API_KEY not in output
