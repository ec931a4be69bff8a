"""``dead-letters list`` and ``replay --dry-run`` over many large rows: memory stays small.

Peak resident memory of the real console script, measured by a parent process that runs
only it (``RUSAGE_CHILDREN``), compared with the same command over one row in the same
run, so the bound is about what the command loaded, not the interpreter's own size.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg2
import pytest

from platform_tasks.envelope import uuid7
from tests.e2e.dead_letters.test_dead_letters_cli import CLI, REPO_ROOT, Env


@pytest.fixture
def cli(redis_url: str, database_url: str) -> Env:
    return Env(redis_url, database_url)


_MAX_RSS_OF_CHILD = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(done.stderr.decode())\n"
)


def _peak_rss_kib(cli: Env, *args: str, code: int = 0) -> int:
    """Peak resident memory (KiB) of one CLI run, measured by a parent that runs only it."""
    out = subprocess.run(
        [sys.executable, "-c", _MAX_RSS_OF_CHILD, CLI, "dead-letters", *args],
        cwd=REPO_ROOT,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    returncode, peak = out.stdout.split()
    assert int(returncode) == code, out.stderr
    return int(peak)


def test_list_and_dry_run_do_not_hold_every_payload_in_memory(cli: Env) -> None:
    """5,000 rows of 100 KiB payloads (about 500 MB once loaded): ``list`` must not load them
    and ``replay --dry-run`` must stream them. The baseline is the same command over one row
    in the same run, so the bound is about what was loaded, not the interpreter's size."""
    rows, blob = 5000, 100 * 1024
    conn = psycopg2.connect(cli.database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload, attempts,"
                " last_error, error_type, reason, correlation_id) "
                "SELECT %(job)s::uuid, 'default', 'tests.record', 't1', jsonb_build_object("
                "'job_id', %(job)s, 'tenant_id', 't1', 'correlation_id', 'c' || n, "
                "'kind', 'tests.record', 'data', jsonb_build_object('blob', repeat('x', %(blob)s))"
                "), 5, 'boom', 'RuntimeError', 'retries_exhausted', 'c' || n "
                "FROM generate_series(1, %(rows)s) AS n",
                {"job": str(uuid7()), "blob": blob, "rows": rows},
            )
    finally:
        conn.close()
    loaded_mib = rows * blob // (1 << 20)
    bound_kib = 100 * 1024  # 100 MiB above the one-row run, a fifth of what loading costs

    one_row = _peak_rss_kib(cli, "list", "--limit", "1")
    every_row = _peak_rss_kib(cli, "list", "--limit", str(rows))
    print(
        f"list peak RSS: 1 row {one_row} KiB, {rows} rows {every_row} KiB "
        f"(payloads {loaded_mib} MiB)"
    )
    assert every_row - one_row < bound_kib

    dry_one = _peak_rss_kib(
        cli, "replay", "--queue", "default", "--since", "2999-01-01", "--dry-run", "--json", code=1
    )
    dry_all = _peak_rss_kib(cli, "replay", "--all", "--dry-run", "--json")
    print(f"dry-run peak RSS: no row {dry_one} KiB, {rows} rows {dry_all} KiB")
    assert dry_all - dry_one < bound_kib

    # --json prints payloads, so it reads them all: 1,500 (146 MiB) keep the run short
    json_rows = 1500
    json_one = _peak_rss_kib(cli, "list", "--json", "--limit", "1")
    json_all = _peak_rss_kib(cli, "list", "--json", "--limit", str(json_rows))
    print(f"list --json peak RSS: 1 row {json_one} KiB, {json_rows} rows {json_all} KiB")
    assert json_all - json_one < bound_kib

    streamed = cli.run("list", "--json", "--limit", "3")
    assert streamed.returncode == 0, streamed.stderr
    assert [len(r["payload"]["data"]["blob"]) for r in json.loads(streamed.stdout)] == [blob] * 3
