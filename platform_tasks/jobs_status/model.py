"""One job's state, decided from what each store says about it.

The stores are read first (:mod:`~platform_tasks.jobs_status.lookup`) into a
:class:`Facts` per job; :func:`decide` is a pure function from those facts to exactly
one :class:`JobStatus`, in this order:

1. ``cancelled``: a cancel's accounting row (``core.dead_letters``, reason ``cancelled``);
2. ``applied``: a committed claim in ``core.processed_jobs`` (a leftover running marker
   of a worker that died after its commit does not change that);
3. ``dead_lettered``: a dead letter pending review or discarded (a replayed one sends
   the job on: it is then found below, or reported dead-lettered and replayed);
4. ``running``: the running marker a worker wrote when the handler started;
5. ``waiting``: the message in a queue list or a tenant lane (or fetched by a worker
   that has not started it);
6. ``delayed``: an entry in the delay store (why: retry, throttle, concurrency cap,
   scheduled) or a ``core.outbox`` row not yet relayed;
7. ``unknown``: none of these, saying which of "never seen" and "older than the stores
   keep" it can tell.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "STATES",
    "Facts",
    "Found",
    "JobStatus",
    "Place",
    "State",
    "decide",
    "job_time",
    "publish_order",
]

Place = Literal["queue", "lane", "fetched", "delay_store"]

State = Literal["waiting", "delayed", "running", "applied", "dead_lettered", "cancelled", "unknown"]
STATES: tuple[State, ...] = (
    "waiting",
    "delayed",
    "running",
    "applied",
    "dead_lettered",
    "cancelled",
    "unknown",
)

_CANCEL_OPERATION = re.compile(r"cancelled by operation (\d+)")


@dataclass(frozen=True)
class Found:
    """A message of the job found in Redis: where, and what its headers say."""

    place: Place
    queue: str | None
    tenant: str | None = None
    ahead: int | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    due_ms: int | None = None


@dataclass
class Facts:
    """Everything the stores said about one job id."""

    job_id: str
    processed: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    marker: dict[str, str] = field(default_factory=dict)
    found: list[Found] = field(default_factory=list)
    operation: dict[str, Any] | None = None
    paused: dict[str, Any] = field(default_factory=dict)
    """Paused queues: name to ``{"operation_id", "actor", "since"}``."""
    unseen: list[str] = field(default_factory=list)
    """What could not be searched (a RabbitMQ broker's queues), for an ``unknown``."""
    keep_days: int = 30


@dataclass(frozen=True)
class JobStatus:
    """Exactly one state of one job, with what the stores said about it."""

    job_id: str
    state: State
    details: dict[str, Any]
    correlation_id: str | None = None
    output: dict[str, Any] | None = None
    """Recorded output per consumer (``applied`` only); shown only to who may see data."""

    def to_json(self, *, with_output: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "job_id": self.job_id,
            "state": self.state,
            "correlation_id": self.correlation_id,
            "details": self.details,
        }
        if with_output and self.output is not None:
            data["output"] = self.output
        return data

    def summary(self) -> str:
        """The state's details as one short line (tables, the console's list)."""
        d = self.details
        if self.state == "waiting":
            lane = f" lane {d['tenant']!r}" if d.get("tenant") is not None else ""
            return f"queue {d.get('queue')}{lane}, {d.get('ahead', '?')} ahead" + (
                " (queue paused)" if d.get("paused") else ""
            )
        if self.state == "delayed":
            return f"{d.get('reason')}, due {d.get('due_at') or 'when relayed'}"
        if self.state == "running":
            return f"on {d.get('host')} pid {d.get('pid')}, attempt {d.get('attempt')}"
        if self.state == "applied":
            return f"by {', '.join(c['consumer'] for c in d.get('consumers', []))}"
        if self.state == "dead_lettered":
            return f"dead letter {d.get('dead_letter_id')} ({d.get('review_status')})"
        if self.state == "cancelled":
            return f"by operation {d.get('operation_id')}"
        return str(d.get("reason", ""))


def decide(facts: Facts, now: datetime | None = None) -> JobStatus:
    """The one state ``facts`` give (the order of the module docstring)."""
    now = now or datetime.now(UTC)
    correlation = _correlation(facts)
    cancel = next((d for d in facts.dead_letters if d["reason"] == "cancelled"), None)
    if cancel is not None:
        return JobStatus(facts.job_id, "cancelled", _cancelled(cancel, facts), correlation)
    if facts.processed:
        return _applied(facts, correlation)
    letter = facts.dead_letters[0] if facts.dead_letters else None
    if letter is not None and letter["status"] != "replayed":
        return JobStatus(facts.job_id, "dead_lettered", _dead_letter(letter), correlation)
    if facts.marker:
        return JobStatus(facts.job_id, "running", _running(facts.marker), correlation)
    waiting = [f for f in facts.found if f.place != "delay_store"]
    if waiting:
        return JobStatus(facts.job_id, "waiting", _waiting(waiting[0], facts, now), correlation)
    delayed = [f for f in facts.found if f.place == "delay_store"]
    if delayed:
        return JobStatus(facts.job_id, "delayed", _delayed(delayed[0]), correlation)
    if facts.outbox:
        return JobStatus(facts.job_id, "delayed", _outbox(facts.outbox[0]), correlation)
    if letter is not None:  # replayed, and its replay not found waiting anywhere
        details = {**_dead_letter(letter), "note": "replayed; the replay was not found waiting"}
        return JobStatus(facts.job_id, "dead_lettered", details, correlation)
    return JobStatus(facts.job_id, "unknown", _unknown(facts, now), correlation)


def _correlation(facts: Facts) -> str | None:
    for row in (*facts.processed, *facts.dead_letters):
        if row.get("correlation_id"):
            return str(row["correlation_id"])
    return None


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC).isoformat()
    return None


def _cancelled(row: dict[str, Any], facts: Facts) -> dict[str, Any]:
    match = _CANCEL_OPERATION.search(str(row.get("discard_reason") or ""))
    details: dict[str, Any] = {
        "operation_id": int(match.group(1)) if match else None,
        "dead_letter_id": row["id"],
        "queue": row.get("queue"),
        "kind": row.get("kind"),
        "at": _iso(row.get("created_at")),
    }
    if facts.operation is not None:
        details["actor"] = facts.operation.get("actor")
    return details


def _applied(facts: Facts, correlation: str | None) -> JobStatus:
    consumers = [
        {"consumer": row["consumer"], "at": _iso(row["processed_at"])} for row in facts.processed
    ]
    recorded = {
        row["consumer"]: row["output"] for row in facts.processed if row.get("output") is not None
    }
    details = {"consumers": consumers, "output_recorded": bool(recorded)}
    return JobStatus(facts.job_id, "applied", details, correlation, recorded or None)


def _dead_letter(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "dead_letter_id": row["id"],
        "review_status": row["status"],
        "reason": row["reason"],
        "error_type": row.get("error_type"),
        "attempts": row.get("attempts"),
        "queue": row.get("queue"),
        "kind": row.get("kind"),
        "at": _iso(row.get("created_at")),
    }


def _running(marker: dict[str, str]) -> dict[str, Any]:
    details: dict[str, Any] = {
        "host": marker.get("host"),
        "pid": _number(marker.get("pid")),
        "attempt": _number(marker.get("attempt")),
        "consumer": marker.get("consumer"),
        "queue": marker.get("queue") or None,
        "since": _iso(_number(marker.get("since"))),
        "progress": None,
    }
    if "done" in marker:
        details["progress"] = {
            "done": _number(marker.get("done")),
            "total": _number(marker.get("total")),
            "note": marker.get("note") or None,
            "at": _iso(_number(marker.get("at"))),
        }
    return details


def _number(value: Any) -> int | float | None:
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else number


def _waiting(found: Found, facts: Facts, now: datetime) -> dict[str, Any]:
    ready = _number(found.headers.get("platform_published_at"))
    details: dict[str, Any] = {
        "queue": found.queue,
        "tenant": found.tenant,
        "ahead": found.ahead,
        "fetched_by_worker": found.place == "fetched",
        "attempt": _number(found.headers.get("platform_attempt")),
        "ready_since": _iso(ready * 1000) if ready is not None else None,
        "waited_seconds": round(now.timestamp() - ready, 3) if ready is not None else None,
        "paused": None,
    }
    if found.queue in facts.paused:
        details["paused"] = facts.paused[found.queue]
    return details


def _delayed(found: Found) -> dict[str, Any]:
    why = found.headers.get("platform_delay_reason")
    attempt = _number(found.headers.get("platform_attempt"))
    details: dict[str, Any] = {
        "queue": found.queue,
        "due_at": _iso(found.due_ms),
        "attempt": attempt,
    }
    if isinstance(why, dict) and why.get("why") == "retry":
        details["reason"] = "retry"
        details["retry"] = {"attempt": attempt, "of": why.get("max")}
    elif isinstance(why, dict) and why.get("why") in ("throttle", "concurrency_cap"):
        details["reason"] = why["why"]
        details["limit"] = why.get("detail")
    else:
        details["reason"] = "scheduled"
    return details


def _outbox(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "reason": "outbox",
        "queue": row.get("queue"),
        "outbox_id": row["id"],
        "committed_at": _iso(row.get("created_at")),
        "due_at": _iso(row.get("due_ms")),
        "note": "committed in core.outbox; a relay has not handed it to the broker yet",
    }


def _unknown(facts: Facts, now: datetime) -> dict[str, Any]:
    created = job_time(facts.job_id)
    searched = "PostgreSQL (claims, dead letters, outbox), running markers, "
    searched += "the delay store and the queues"
    if created is not None and (now - created).days >= facts.keep_days:
        return {
            "reason": "expired",
            "note": f"published {created.isoformat()}, longer ago than the stores keep "
            f"(claims are purged after {facts.keep_days} days)",
        }
    note = f"not found in {searched}: never published, or published elsewhere"
    if facts.unseen:
        note += f"; cannot see into {', '.join(facts.unseen)}"
    return {"reason": "never_seen", "note": note, "published_at": _iso(created)}


def job_time(job_id: str) -> datetime | None:
    """When a UUIDv7 job id was made (the platform's ids are), else ``None``."""
    try:
        value = uuid.UUID(job_id)
    except ValueError:
        return None
    if value.version != 7:
        return None
    return datetime.fromtimestamp((value.int >> 80) / 1000, UTC)


def publish_order(job_id: str) -> tuple[float, str]:
    """Sort key in publish order where the id tells it (UUIDv7), the rest after."""
    created = job_time(job_id)
    return (created.timestamp() if created is not None else float("inf"), job_id)
