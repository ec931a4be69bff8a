"""Every dead-letter write is storable: NUL, lone surrogates, NaN and bytes against real jsonb.

PostgreSQL refuses NUL in ``text`` and ``jsonb`` and lone surrogates anywhere; a job holding
one must still become a dead letter (escaped, and marked so), never a failed write.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg2
import pytest
from psycopg2.extensions import connection as Connection

from platform_tasks.dead_letters.dead_letter import (
    ESCAPED_KEY,
    insert_dead_letter,
    storable_payload,
    storable_text,
)
from platform_tasks.dead_letters.store import get_dead_letter, replay_refusal
from tests.integration.dead_letters.conftest import envelope


def _insert(conn: Connection, payload: Any, **overrides: Any) -> int:
    values: dict[str, Any] = {
        "job_id": None,
        "queue": "default",
        "kind": "tests.record",
        "tenant_id": "t1",
        "payload": payload,
        "attempts": 5,
        "last_error": "RuntimeError: boom",
        "error_type": "RuntimeError",
        "reason": "poison",
        "correlation_id": "c1",
    }
    values.update(overrides)
    with conn, conn.cursor() as cur:
        return insert_dead_letter(cur, **values)


def test_the_unescaped_values_are_what_postgres_refuses(conn: Connection) -> None:
    """The premise: without escaping, each of these writes fails."""
    for literal, as_json in (("a\x00b", True), ("a\x00b", False), ("\ud800", False)):
        refused = (psycopg2.DataError, ValueError, UnicodeEncodeError)
        with pytest.raises(refused), conn, conn.cursor() as cur:
            if as_json:
                cur.execute("SELECT %s::jsonb", (json.dumps({"x": literal}),))
            else:
                cur.execute("SELECT %s::text", (literal,))
    with pytest.raises(psycopg2.DataError), conn, conn.cursor() as cur:
        cur.execute("SELECT %s::jsonb", (json.dumps({"x": float("nan")}),))


def test_a_payload_postgres_cannot_store_is_stored_escaped_and_marked(conn: Connection) -> None:
    payload = envelope()
    payload["correlation_id"] = "req\x00-7"
    payload["data"] = {
        "note": "before\x00after",
        "lines": [{"text": "ok"}, {"te\x00xt": "\ud83d broken pair"}],
        "ratio": float("nan"),
    }
    row_id = _insert(
        conn,
        payload,
        job_id=uuid.UUID(payload["job_id"]),
        correlation_id=payload["correlation_id"],
        last_error="ValueError: bad value 'x\x00y'",
        kind="tests.re\x00cord",
    )
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None
    stored = row.payload
    assert stored["correlation_id"] == "req\\u0000-7"
    assert stored["data"]["note"] == "before\\u0000after"
    assert stored["data"]["lines"][1] == {"te\\u0000xt": "\\ud83d broken pair"}
    assert stored["data"]["ratio"] == "nan"
    marks = stored[ESCAPED_KEY]
    assert "correlation_id (NUL)" in marks
    assert "data.note (NUL)" in marks
    assert "data.lines.1.te\\u0000xt (key: NUL)" in marks
    assert "data.lines.1.te\\u0000xt (lone surrogate)" in marks
    assert "data.ratio (non-finite number)" in marks
    assert "column kind (NUL)" in marks and "column correlation_id (NUL)" in marks
    assert row.kind == "tests.re\\u0000cord" and row.correlation_id == "req\\u0000-7"
    assert row.last_error is not None
    assert row.last_error.startswith("ValueError: bad value 'x\\u0000y'")
    assert "stored with escapes" in row.last_error
    # An escaped row is not the original envelope: replay refuses it, saying why.
    refusal = replay_refusal("default", stored)
    assert refusal is not None and "stored with escapes" in refusal


def test_the_connection_stays_usable_after_an_escaped_write(conn: Connection) -> None:
    _insert(conn, {"raw": "\x00\x00", "content_type": "text/plain", "headers": {"h\x00": 1}})
    row_id = _insert(conn, envelope())
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None and ESCAPED_KEY not in row.payload


def test_payloads_that_are_not_objects_and_odd_values_are_stored(conn: Connection) -> None:
    row_id = _insert(conn, ["a\x00", b"\x00\xff", {1: "int key"}, object()])
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None
    value = row.payload["value"]
    assert value[0] == "a\\u0000"
    assert value[1] == "AP8="
    assert value[2] == {"1": "int key"}
    assert value[3].startswith("<object object at")
    assert "1 (bytes as base64)" in row.payload[ESCAPED_KEY]


def test_clean_values_are_returned_untouched() -> None:
    payload = envelope()
    assert storable_payload(payload).value == payload
    assert storable_payload(payload).escaped == []
    assert storable_text("\\u0000 is text, not NUL") == ("\\u0000 is text, not NUL", None)
