"""Progress markers of fan-out jobs, so a redelivered or replayed fan-out resumes.

The fan-out's own transaction (the one holding its idempotency row) commits only when
every tenant is published, so the marker is written on a separate autocommit connection
after each published batch: a delivery killed halfway leaves a marker behind, and the
next delivery starts after the last tenant it names. A batch published but not yet
marked is published again with the same job ids, which the tenants' consumers absorb.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg2

from platform_tasks.postgres.queries import load_queries

__all__ = ["Progress", "ProgressStore"]


@dataclass(frozen=True)
class Progress:
    """Where a fan-out job stands: the last tenant published and how many so far."""

    last_tenant_id: str | None
    published: int
    finished: bool


class ProgressStore:
    """Reads and writes ``core.fanout_progress`` rows of one fan-out job."""

    def __init__(self, database_url: str) -> None:
        self._queries = load_queries("fanout")
        self._conn = psycopg2.connect(database_url, connect_timeout=10)
        self._conn.autocommit = True

    def start(self, job_id: uuid.UUID, *, job: str, point: datetime, kind: str) -> Progress:
        """Record the job (a rerun keeps its marker) and return where it stands."""
        with self._conn.cursor() as cur:
            cur.execute(self._queries["start_progress"], (str(job_id), job, point, kind))
            cur.execute(self._queries["load_progress"], (str(job_id),))
            row = cur.fetchone()
        assert row is not None
        return Progress(last_tenant_id=row[0], published=int(row[1]), finished=row[2] is not None)

    def save(self, job_id: uuid.UUID, *, last_tenant_id: str, published: int) -> None:
        with self._conn.cursor() as cur:
            cur.execute(self._queries["save_progress"], (last_tenant_id, published, str(job_id)))

    def finish(self, job_id: uuid.UUID, *, purge_after_days: int) -> None:
        with self._conn.cursor() as cur:
            cur.execute(self._queries["finish_progress"], (str(job_id),))
            cur.execute(self._queries["purge_progress"], (purge_after_days,))

    def close(self) -> None:
        self._conn.close()
