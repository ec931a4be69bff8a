"""``platform-tasks maintenance`` end to end: the real console script against real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2

from tests.support.processes import platform_env

REPO_ROOT = Path(__file__).resolve().parents[3]
CLI = str(Path(sys.executable).parent / "platform-tasks")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "maintenance", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_purge_processed_jobs_command(redis_url: str, database_url: str) -> None:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.processed_jobs (job_id, consumer, processed_at) "
                "SELECT gen_random_uuid(), 'old', now() - interval '31 days' "
                "FROM generate_series(1, 250)"
            )
            cur.execute(
                "INSERT INTO core.processed_jobs (job_id, consumer, processed_at) "
                "SELECT gen_random_uuid(), 'young', now() - interval '2 days' "
                "FROM generate_series(1, 5)"
            )
        env = platform_env(redis_url=redis_url, database_url=database_url)
        result = run(env, "purge-processed-jobs", "--batch-size", "100")
        assert result.returncode == 0, result.stderr
        assert "deleted 250 processed_jobs rows" in result.stdout
        assert "in 3 transactions" in result.stdout
        with conn, conn.cursor() as cur:
            cur.execute("SELECT consumer, count(*) FROM core.processed_jobs GROUP BY consumer")
            assert dict(cur.fetchall()) == {"young": 5}

        env["PLATFORM_PROCESSED_JOBS_TTL_DAYS"] = "1"
        shorter = run(env, "purge-processed-jobs")
        assert shorter.returncode == 0, shorter.stderr
        assert "deleted 5 processed_jobs rows" in shorter.stdout

        assert run(env, "purge-processed-jobs", "--batch-size", "0").returncode == 2
        del env["PLATFORM_DATABASE_URL"]
        missing = run(env, "purge-processed-jobs")
        assert missing.returncode == 2
        assert "PLATFORM_DATABASE_URL" in missing.stderr
    finally:
        conn.close()


def test_report_stale_dead_letters_command(redis_url: str, database_url: str) -> None:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    clean = run(env, "report-stale-dead-letters")
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.startswith("0 dead letter(s)")
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.dead_letters (payload, reason, created_at) "
                "VALUES ('{}'::jsonb, 'poison', now() - interval '2 days')"
            )
    finally:
        conn.close()
    stale = run(env, "report-stale-dead-letters")
    assert stale.returncode == 1
    assert stale.stdout.startswith("1 dead letter(s)")
    assert "alert" in stale.stderr
