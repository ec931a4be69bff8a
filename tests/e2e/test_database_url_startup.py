"""A worker refuses to start on a PLATFORM_DATABASE_URL it cannot use, and prints no password.

Real ``celery -A tests.apps.consumer_app worker`` processes (the solo pool, without mingle
and gossip, only to keep start-up short; nothing here depends on the pool), each given a
URL with a password that must not appear anywhere in their output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from platform_tasks.harness import PostgresServer, free_port
from tests.support.processes import CELERY, platform_env

REPO_ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Sup3r-s3cret-pw"


def _start_worker(redis_url: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    argv = [CELERY, "-A", "tests.apps.consumer_app", "worker", "-P", "solo",
            "--without-mingle", "--without-gossip", "--loglevel", "INFO"]  # fmt: skip
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _urls(postgres: PostgresServer) -> dict[str, str]:
    port = urlsplit(postgres.url).port
    return {
        "unknown option": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/x?colour=blue",
        "bad port": f"postgresql://postgres:{PASSWORD}@127.0.0.1:54x32/platform",
        "bad host": f"postgresql://postgres:{PASSWORD}@[::1/platform",
        "unreachable": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/platform",
        "no such database": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/no_such_db",
    }


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unknown option", 'invalid URI query parameter: "colour"'),
        ("bad port", "port '54x32'"),
        ("bad host", "IPv6 host address"),
        ("unreachable", "cannot connect before consuming"),
        ("no such database", 'database "no_such_db" does not exist'),
    ],
)
def test_worker_refuses_a_database_url_it_cannot_use(
    redis_url: str, postgres_server: PostgresServer, case: str, says: str
) -> None:
    result = _start_worker(redis_url, _urls(postgres_server)[case])
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "PLATFORM_DATABASE_URL" in output, output[-3000:]
    assert says in output, output[-3000:]
    assert "ready." not in output
    assert PASSWORD not in output
    assert "postgres:***@" in output
