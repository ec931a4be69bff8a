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
    return {
        "job_id": str(uuid7()),
        "tenant_id": tenant,
        "correlation_id": uuid.uuid4().hex,
        "kind": kind,
        "data": dict(data),
    }


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
        return subprocess.run(
            [CLI, *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [CLI, *args],
            cwd=REPO_ROOT,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )

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
    headers: dict[str, Any] | None = None,
) -> list[str]:
    """``count`` pending dead letters of ``tests.ops.apply`` jobs, in one statement;
    their job ids. ``headers``: the stored headers of each (trace context, custom)."""
    rows = []
    for _ in range(count):
        payload = envelope(tenant)
        rows.append(
            (
                payload["job_id"],
                queue,
                APPLY,
                tenant,
                Json(payload),
                5,
                "boom",
                error_type,
                "retries_exhausted",
                payload["correlation_id"],
                Json(headers) if headers is not None else None,
            )
        )
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            execute_values(
                cur,
                "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload, "
                "attempts, last_error, error_type, reason, correlation_id, headers) VALUES %s",
                rows,
                page_size=1000,
            )
    finally:
        conn.close()
    return [row[0] for row in rows]


def json_out(stdout: str, stderr: str = "") -> Any:
    """The JSON a command printed, or a failure showing what it printed instead."""
    try:
        return json.loads(stdout)
    except ValueError as exc:
        raise AssertionError(f"not JSON: {stdout[-2000:]}\n{stderr[-2000:]}") from exc


STORED_HEADERS: dict[str, Any] = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=1",
    "x-request": "r-1",
    "platform_headers": ["x-request", "retries"],
    "platform_publish_time": 1.0,
    "retries": 9,
}
"""A dead letter's stored headers: trace context, a custom header, the publish time of
the failed message and a name Celery uses (kept by a row stored before it was refused)."""

REPLAYED_HEADERS: dict[str, Any] = {
    "traceparent": STORED_HEADERS["traceparent"],
    "tracestate": "vendor=1",
    "x-request": "r-1",
    "platform_headers": ["x-request"],
    "retries": 0,
}
"""Those of :data:`STORED_HEADERS` a replay sends: the trace context and the custom header,
Celery's own ``retries``; the publish time is the replay's own."""


def replayed_headers(client: Any, queue: str) -> dict[str, Any]:
    """The headers of the one message on ``queue``'s Redis list, limited to the names of
    :data:`REPLAYED_HEADERS`; asserts that its publish time is not the stored one."""
    (raw,) = client.lrange(queue, 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["platform_publish_time"] > STORED_HEADERS["platform_publish_time"]
    return {name: headers.get(name) for name in REPLAYED_HEADERS}
