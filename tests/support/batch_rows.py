"""Batches written straight into ``core.batches`` / ``core.batch_jobs`` / ``core.batch_shards``
for the tests of what reads them (the read model, the CLI, the console, the watchdog):
every state a batch can be in, at given times, without running its children."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg2

SHARDS = 4


@dataclass
class Child:
    tenant_id: str
    outcome: str | None = None
    ended_at: datetime | None = None
    job_id: uuid.UUID = field(default_factory=uuid.uuid4)
    queue: str = "default"
    kind: str = "reports.render"


def insert_batch(
    database_url: str,
    children: Sequence[Child],
    *,
    description: str = "",
    created_at: datetime | None = None,
    on_complete: dict[str, Any] | None = None,
    on_success: dict[str, Any] | None = None,
    on_death: dict[str, Any] | None = None,
    complete_fired_at: datetime | None = None,
    death_fired_at: datetime | None = None,
    batch_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """One batch with ``children``; its shards count the children without an outcome.
    ``progressed_at`` is ``created_at`` or the newest ending, whichever is later."""
    batch_id = batch_id or uuid.uuid4()
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.batches (batch_id, profile, description, shards, on_complete,"
                " on_success, on_death, created_at, progressed_at, complete_fired_at,"
                " death_fired_at) VALUES (%s, 'test', %s, %s, %s, %s, %s,"
                " COALESCE(%s, now()), COALESCE(%s, now()), %s, %s)",
                (
                    str(batch_id),
                    description,
                    SHARDS,
                    _spec(on_complete),
                    _spec(on_success),
                    _spec(on_death),
                    created_at,
                    max([created_at, *(c.ended_at for c in children)], key=_order),
                    complete_fired_at,
                    death_fired_at,
                ),
            )
            for child in children:
                cur.execute(
                    "INSERT INTO core.batch_jobs (batch_id, job_id, queue, kind, tenant_id,"
                    " added_at, outcome, ended_at) VALUES (%s, %s, %s, %s, %s,"
                    " COALESCE(%s, now()), %s, %s)",
                    (
                        str(batch_id),
                        str(child.job_id),
                        child.queue,
                        child.kind,
                        child.tenant_id,
                        created_at,
                        child.outcome,
                        child.ended_at,
                    ),
                )
            cur.execute(
                "INSERT INTO core.batch_shards (batch_id, shard, remaining)"
                " SELECT %(batch)s, s, (SELECT count(*) FROM core.batch_jobs j"
                "   WHERE j.batch_id = %(batch)s AND j.outcome IS NULL"
                "   AND ((hashtext(j.job_id::text) %% %(shards)s) + %(shards)s) %% %(shards)s = s)"
                " FROM generate_series(0, %(shards)s - 1) s",
                {"batch": str(batch_id), "shards": SHARDS},
            )
    finally:
        conn.close()
    return batch_id


def end_child(database_url: str, batch_id: uuid.UUID, job_id: uuid.UUID, at: datetime) -> None:
    """Record one child's ending as the counting does: outcome, its shard, progressed_at."""
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "UPDATE core.batch_jobs SET outcome = 'applied', ended_at = %s"
                " WHERE batch_id = %s AND job_id = %s AND outcome IS NULL",
                (at, str(batch_id), str(job_id)),
            )
            cur.execute(
                "UPDATE core.batch_shards SET remaining = remaining - 1 WHERE batch_id = %(b)s"
                " AND shard = ((hashtext(%(j)s) %% %(n)s) + %(n)s) %% %(n)s",
                {"b": str(batch_id), "j": str(job_id), "n": SHARDS},
            )
            cur.execute(
                "UPDATE core.batches SET progressed_at = %s WHERE batch_id = %s",
                (at, str(batch_id)),
            )
    finally:
        conn.close()


def _spec(spec: dict[str, Any] | None) -> str | None:
    return json.dumps(spec) if spec is not None else None


def _order(value: datetime | None) -> float:
    return value.timestamp() if value is not None else float("-inf")
