"""Helpers shared by the dead-letter integration tests: connections and row factories."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
from psycopg2.extensions import connection as Connection

from platform_tasks.dead_letters.dead_letter import insert_dead_letter
from platform_tasks.envelope import uuid7


@pytest.fixture
def conn(database_url: str) -> Iterator[Connection]:
    connection = psycopg2.connect(database_url)
    yield connection
    connection.close()


def envelope(kind: str = "tests.record", tenant: str = "t1") -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": tenant,
        "correlation_id": uuid.uuid4().hex,
        "kind": kind,
        "data": {"n": 1},
    }


AddRow = Callable[..., int]


@pytest.fixture
def add_row(conn: Connection) -> AddRow:
    """Insert one committed dead letter; keyword arguments override the defaults."""

    def add(**overrides: Any) -> int:
        payload = overrides.pop("payload", None) or envelope(
            kind=overrides.get("kind", "tests.record"), tenant=overrides.get("tenant_id", "t1")
        )
        job_id = overrides.pop("job_id", None) if "job_id" in overrides else payload["job_id"]
        values: dict[str, Any] = {
            "job_id": uuid.UUID(str(job_id)) if job_id else None,
            "queue": "default",
            "kind": payload.get("kind"),
            "tenant_id": payload.get("tenant_id"),
            "payload": payload,
            "attempts": 5,
            "last_error": "RuntimeError: boom\nTraceback ...",
            "error_type": "RuntimeError",
            "reason": "retries_exhausted",
            "correlation_id": payload.get("correlation_id"),
        }
        values.update(overrides)
        with conn, conn.cursor() as cur:
            return insert_dead_letter(cur, **values)

    return add


def poison_payload() -> dict[str, Any]:
    return {"raw": "not json {", "content_type": "application/json", "headers": {"id": "x"}}
