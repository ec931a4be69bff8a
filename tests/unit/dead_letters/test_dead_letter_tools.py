"""Pure pieces of the dead-letter tooling: named queries, --since, replayability."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import click
import pytest

from platform_tasks.cli.dead_letters import parse_since
from platform_tasks.dead_letters.store import replay_refusal
from platform_tasks.envelope import uuid7
from platform_tasks.postgres.queries import load_queries, parse_queries

NOW = datetime(2030, 1, 10, 12, 0, tzinfo=UTC)


def test_parse_queries_splits_on_name_lines() -> None:
    text = "-- header\n-- name: first\n-- why\nSELECT 1;\n\n-- name: second\nSELECT 2;\n"
    assert parse_queries(text) == {"first": "-- why\nSELECT 1;", "second": "SELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_shipped_query_files_load() -> None:
    assert {"insert_dead_letter", "lock_replay_batch", "mark_replayed"} <= set(
        load_queries("dead_letters")
    )
    assert "SKIP LOCKED" in load_queries("maintenance")["purge_processed_jobs_batch"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW - timedelta(minutes=30)),
        ("6h", NOW - timedelta(hours=6)),
        ("7d", NOW - timedelta(days=7)),
        ("2w", NOW - timedelta(weeks=2)),
        ("2030-01-01", datetime(2030, 1, 1, tzinfo=UTC)),
        ("2030-01-01T05:00:00+02:00", datetime(2030, 1, 1, 3, 0, tzinfo=UTC)),
    ],
)
def test_parse_since(text: str, expected: datetime) -> None:
    assert parse_since(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["", "6 hours", "yesterday", "-1d", "7y"])
def test_parse_since_rejects_other_text(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_since(text, now=NOW)


def test_replay_refusal() -> None:
    good = {
        "job_id": str(uuid7()),
        "tenant_id": "t",
        "correlation_id": "c",
        "kind": "a.b",
        "data": {},
    }
    assert replay_refusal("q", good) is None
    assert replay_refusal(None, good) == "no original queue recorded"
    raw = {"raw": "x", "content_type": "text/plain", "headers": {}}
    assert "raw message" in (replay_refusal("q", raw) or "")
    v4 = {**good, "job_id": str(uuid.uuid4())}
    assert "not a readable envelope" in (replay_refusal("q", v4) or "")
    assert "not a readable envelope" in (replay_refusal("q", ["not", "a", "dict"]) or "")
