"""Helpers of the operations tests: the operator's shell, dead letters in bulk, the
applied-jobs table of ``tests.apps.operations_app``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2.extras import Json, execute_values

from platform_tasks.envelope import uuid7
from tests.support.processes import platform_env

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "platform-tasks")
APP = "tests.apps.operations_app:app"
APPLY = "tests.ops.apply"


def envelope(tenant: str = "t1", kind: str = APPLY, **data: Any) -> dict[str, Any]:
    return {"job_id": str(uuid7()), "tenant_id": tenant, "correlation_id": uuid.uuid4().hex,
            "kind": kind, "data": dict(data)}  # fmt: skip


class Shell:
    """The operator's shell: ``PLATFORM_*`` exported, the CLI run as a subprocess."""

    def __init__(self, redis_url: str, database_url: str) -> None:
        self.database_url = database_url
        self.env = platform_env(
            redis_url=redis_url,
            database_url=database_url,
            extra={"PLATFORM_APP": APP, "PLATFORM_ACTOR": "tester"},
        )

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, *args], cwd=REPO_ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([CLI, *args], cwd=REPO_ROOT, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)  # fmt: skip

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.query(sql, params)[0][0]


def create_applied_table(database_url: str) -> None:
    from tests.apps.operations_app import TABLE

    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(TABLE)
            cur.execute("TRUNCATE public.ops_applied")
    finally:
        conn.close()


def add_dead_letters(
    database_url: str,
    count: int,
    *,
    queue: str = "default",
    tenant: str = "t1",
    error_type: str = "RuntimeError",
) -> list[str]:
    """``count`` pending dead letters of ``tests.ops.apply`` jobs, in one statement;
    their job ids."""
    rows = []
    for _ in range(count):
        payload = envelope(tenant)
        rows.append((payload["job_id"], queue, APPLY, tenant, Json(payload), 5, "boom",
                     error_type, "retries_exhausted", payload["correlation_id"]))  # fmt: skip
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            execute_values(
                cur,
                "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload, "
                "attempts, last_error, error_type, reason, correlation_id) VALUES %s",
                rows, page_size=1000,
            )  # fmt: skip
    finally:
        conn.close()
    return [row[0] for row in rows]


def json_out(stdout: str, stderr: str = "") -> Any:
    """The JSON a command printed, or a failure showing what it printed instead."""
    try:
        return json.loads(stdout)
    except ValueError as exc:
        raise AssertionError(f"not JSON: {stdout[-2000:]}\n{stderr[-2000:]}") from exc
