"""What a batch looks like from outside: the read model of ``batches list|show`` and the
console's batch pages.

Everything here reads ``core.batches`` and ``core.batch_jobs`` (never the shards: a
child's outcome on its own row is the truth the shards only count), so the CLI and the
console cannot disagree. Counts are by outcome (``applied``, ``dead_lettered``,
``discarded``, ``cancelled``) plus ``outstanding`` (no outcome yet), and by tenant.

Where the outstanding children *are* is not in PostgreSQL: a :class:`ChildLocator`
answers it (:mod:`~platform_tasks.batches.locator` looks in the delay store and asks the
workers which jobs they run). :func:`places` turns its answer into
:class:`Places`: ``waiting`` (on a queue, or anywhere the locator did not find it),
``delayed``, ``running``, and ``dead`` (children with a dead letter pending review).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from psycopg2.extensions import connection as Connection

from platform_tasks.postgres.queries import load_queries

__all__ = [
    "CALLBACKS",
    "BatchDetail",
    "BatchSummary",
    "CallbackStatus",
    "ChildLocator",
    "Counts",
    "Places",
    "TenantCounts",
    "list_batches",
    "parse_batch_id",
    "places",
    "show_batch",
]

CALLBACKS = ("on_complete", "on_success", "on_death")
DEFAULT_LIST_LIMIT = 50
TENANTS_SHOWN = 100
"""Tenants listed by ``show`` (the most children first); the total is always given."""
LOCATE_LIMIT = 10_000
"""Outstanding children looked up by :func:`places` (the oldest first); beyond it, the
rest are counted as ``waiting`` and :attr:`Places.unlocated` says how many."""


def _queries() -> dict[str, str]:
    return load_queries("batch_status")


@dataclass(frozen=True)
class Counts:
    """Children by outcome; ``outstanding`` have none yet."""

    applied: int = 0
    dead_lettered: int = 0
    discarded: int = 0
    cancelled: int = 0
    outstanding: int = 0

    @property
    def total(self) -> int:
        return (
            self.applied + self.dead_lettered + self.discarded + self.cancelled + self.outstanding
        )

    @property
    def ended(self) -> int:
        return self.applied + self.dead_lettered + self.discarded + self.cancelled

    def to_json(self) -> dict[str, int]:
        return {
            "applied": self.applied,
            "dead_lettered": self.dead_lettered,
            "discarded": self.discarded,
            "cancelled": self.cancelled,
            "outstanding": self.outstanding,
            "total": self.total,
        }


@dataclass(frozen=True)
class CallbackStatus:
    """One callback of a batch: what it publishes (``None``: not set) and when it fired."""

    name: str
    queue: str | None
    kind: str | None
    fired_at: datetime | None

    @property
    def is_set(self) -> bool:
        return self.kind is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "set": self.is_set,
            "queue": self.queue,
            "kind": self.kind,
            "fired_at": _iso(self.fired_at),
        }


@dataclass(frozen=True)
class BatchSummary:
    """One batch as ``batches list`` shows it."""

    batch_id: uuid.UUID
    profile: str
    description: str
    created_at: datetime
    progressed_at: datetime
    stall_alerted_at: datetime | None
    counts: Counts
    callbacks: tuple[CallbackStatus, ...]

    @property
    def complete(self) -> bool:
        """Every child has ended (a replayed dead letter re-opens the batch)."""
        return self.counts.outstanding == 0

    @property
    def state(self) -> str:
        return "complete" if self.complete else "open"

    def callback(self, name: str) -> CallbackStatus:
        return next(c for c in self.callbacks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": str(self.batch_id),
            "profile": self.profile,
            "description": self.description,
            "state": self.state,
            "created_at": _iso(self.created_at),
            "progressed_at": _iso(self.progressed_at),
            "stall_alerted_at": _iso(self.stall_alerted_at),
            "counts": self.counts.to_json(),
            "callbacks": [c.to_json() for c in self.callbacks],
        }


@dataclass(frozen=True)
class TenantCounts:
    tenant_id: str
    counts: Counts

    def to_json(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, **self.counts.to_json()}


@dataclass(frozen=True)
class Places:
    """Where a batch's unfinished children are. ``waiting``, ``delayed`` and ``running``
    split the outstanding children; ``dead`` counts children with a dead letter pending
    review (ended, but what an operator would replay). ``unknown`` names the places the
    locator could not look in (e.g. no worker answered), whose children are counted as
    waiting; ``unlocated`` children were beyond :data:`LOCATE_LIMIT`."""

    waiting: int
    delayed: int
    running: int
    dead: int
    unknown: tuple[str, ...] = ()
    unlocated: int = 0

    def describe(self) -> str:
        text = (
            f"{self.waiting} waiting, {self.delayed} delayed, "
            f"{self.running} running, {self.dead} dead"
        )
        notes = []
        if self.unknown:
            notes.append(f"could not look in: {', '.join(self.unknown)}")
        if self.unlocated:
            notes.append(f"{self.unlocated} not looked up, counted as waiting")
        return text + (f" ({'; '.join(notes)})" if notes else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting": self.waiting,
            "delayed": self.delayed,
            "running": self.running,
            "dead": self.dead,
            "unknown": list(self.unknown),
            "unlocated": self.unlocated,
        }


@dataclass(frozen=True)
class BatchDetail:
    """One batch as ``batches show`` shows it."""

    summary: BatchSummary
    tenants: tuple[TenantCounts, ...]
    tenant_total: int
    places: Places | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary.to_json(),
            "tenant_total": self.tenant_total,
            "tenants": [t.to_json() for t in self.tenants],
            "places": self.places.to_json() if self.places is not None else None,
        }


class ChildLocator(Protocol):
    """Finds where outstanding jobs are, outside PostgreSQL."""

    def locate(self, job_ids: Sequence[str]) -> Mapping[str, str]:
        """``{job id: "delayed" | "running"}`` for the jobs found; the rest are waiting."""
        ...

    @property
    def unknown(self) -> tuple[str, ...]:
        """The places the last :meth:`locate` could not look in."""
        ...


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def parse_batch_id(text: str) -> uuid.UUID:
    """A batch id from user input; ``ValueError`` naming the text when it is not a UUID."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a batch id (a UUID)") from None


def _spec_target(spec: Any) -> tuple[str | None, str | None]:
    if not isinstance(spec, Mapping):
        return None, None
    queue, kind = spec.get("queue"), spec.get("kind")
    return (str(queue) if queue is not None else None, str(kind) if kind is not None else None)


def _summary(row: Sequence[Any]) -> BatchSummary:
    (batch_id, profile, description, created, progressed) = row[:5]
    fired = dict(zip(CALLBACKS, row[5:8], strict=True))
    stall_alerted_at = row[8]
    specs = dict(zip(CALLBACKS, row[9:12], strict=True))
    callbacks = tuple(
        CallbackStatus(name, *_spec_target(specs[name]), fired[name]) for name in CALLBACKS
    )
    return BatchSummary(
        batch_id=uuid.UUID(str(batch_id)),
        profile=profile,
        description=description,
        created_at=created,
        progressed_at=progressed,
        stall_alerted_at=stall_alerted_at,
        counts=Counts(*(int(n) for n in row[12:17])),
        callbacks=callbacks,
    )


def list_batches(
    conn: Connection,
    *,
    limit: int = DEFAULT_LIST_LIMIT,
    before: datetime | None = None,
    open_only: bool = False,
) -> list[BatchSummary]:
    """The newest batches first (created before ``before`` when given: the next page)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["list_batches"],
            {"limit": limit, "before": before, "open_only": open_only},
        )
        return [_summary(row) for row in cur.fetchall()]


def show_batch(
    conn: Connection,
    batch_id: uuid.UUID,
    *,
    locator: ChildLocator | None = None,
    tenants_shown: int = TENANTS_SHOWN,
) -> BatchDetail | None:
    """One batch with its tenants; with a ``locator``, where its children are."""
    with conn, conn.cursor() as cur:
        cur.execute(_queries()["one_batch"], {"batch": str(batch_id)})
        row = cur.fetchone()
        if row is None:
            return None
        summary = _summary(row)
        cur.execute(_queries()["tenant_counts"], {"batch": str(batch_id), "limit": tenants_shown})
        tenants = tuple(
            TenantCounts(tenant, Counts(*(int(n) for n in counts)))
            for tenant, *counts in cur.fetchall()
        )
        cur.execute(_queries()["tenant_total"], {"batch": str(batch_id)})
        tenant_total = int(cur.fetchone()[0])
    found = places(conn, summary, locator) if locator is not None else None
    return BatchDetail(summary, tenants, tenant_total, found)


def places(conn: Connection, summary: BatchSummary, locator: ChildLocator) -> Places:
    """Where ``summary``'s outstanding children are (the oldest :data:`LOCATE_LIMIT`)."""
    with conn, conn.cursor() as cur:
        cur.execute(
            _queries()["outstanding_jobs"],
            {"batch": str(summary.batch_id), "limit": LOCATE_LIMIT},
        )
        job_ids = [job_id for (job_id,) in cur.fetchall()]
        cur.execute(_queries()["dead_pending"], {"batch": str(summary.batch_id)})
        dead = int(cur.fetchone()[0])
    found = list(locator.locate(job_ids).values()) if job_ids else []
    running, delayed = found.count("running"), found.count("delayed")
    outstanding = summary.counts.outstanding
    return Places(
        waiting=max(0, outstanding - delayed - running),
        delayed=delayed,
        running=running,
        dead=dead,
        unknown=tuple(locator.unknown),
        unlocated=max(0, outstanding - len(job_ids)),
    )
