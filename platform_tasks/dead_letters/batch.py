"""The one step that replays or discards dead letters: lock a batch, act, mark, commit.

Replay and discard by id (:mod:`platform_tasks.dead_letters.store`), by filter and
``--all`` (:mod:`platform_tasks.operations.bulk`, also what the console runs) hand their
rows to :func:`settle_batch`, as procrastinate's worker, shell and Django admin all retry
a job through its one ``retry_job_by_id``. So a row goes out the same way whichever way
it was selected: its envelope to its original queue under its job id, with the trace
context and custom headers it was stored with, and the same rows are refused.

A batch is one transaction: the caller's query locks the rows, the step publishes (or
marks discarded) each one, marks the published rows ``replayed``, lets the caller record
its own bookkeeping (an operation's counts) in the same transaction, and commits. The
:class:`Outcome` it returns names the ``(queue, kind, error type)`` groups it settled:
what a follow-up of a settled group (resolving that group's incident) acts on, after the
commit in :func:`settle_batch`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor

from platform_tasks.dead_letters.dead_letter import ESCAPED_KEY
from platform_tasks.envelope import parse_envelope
from platform_tasks.errors import EnvelopeError
from platform_tasks.headers import BATCH_HEADER
from platform_tasks.observability.reserved_headers import without_reserved
from platform_tasks.observability.trace_context import without_publish_time
from platform_tasks.postgres.queries import load_queries

__all__ = [
    "Discard",
    "Group",
    "Outcome",
    "Publish",
    "Replay",
    "ReplayedRow",
    "replay_refusal",
    "settle_batch",
]

logger = logging.getLogger(__name__)

Publish = Callable[..., object]
"""Publishes one envelope to a queue, e.g. ``QueuePort(app).publish``: called as
``publish(queue, envelope)``, or ``publish(queue, envelope, {"headers": {...}})`` for a row
stored with headers (its trace context and the publisher's custom headers)."""


class Group(NamedTuple):
    """Dead letters of one queue, job kind and error type: what an alert is raised for."""

    queue: str | None
    kind: str | None
    error_type: str | None


@dataclass(frozen=True)
class ReplayedRow:
    id: int
    job_id: uuid.UUID
    queue: str


@dataclass
class Outcome:
    """What a replay or discard did (or, for a dry run, would do): of one batch, or of a
    whole replay or discard by id."""

    dry_run: bool = False
    replayed: list[ReplayedRow] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    """``(id, why)`` for pending rows that cannot be replayed (e.g. not an envelope)."""
    not_pending: list[tuple[int, str]] = field(default_factory=list)
    """``(id, status or 'not found')`` for explicitly named ids that were not acted on."""
    groups: set[Group] = field(default_factory=set)
    """The groups of the rows replayed or discarded."""
    locked: list[int] = field(default_factory=list)
    """Ids of the rows the batch locked, in id order (acted on or refused)."""
    stopped: tuple[int, Exception] | None = None
    """The row whose publish failed and why; the batch stopped there, the rows published
    before it are committed as replayed, it and the rest stay pending."""

    def add(self, batch: Outcome) -> None:
        """Count a batch's rows in this outcome (its ``stopped`` is the caller's to raise)."""
        self.replayed.extend(batch.replayed)
        self.discarded.extend(batch.discarded)
        self.refused.extend(batch.refused)
        self.groups |= batch.groups


class Replay:
    """Publish each row again: with ``publish``, or with what ``open_publish`` returns,
    called once, at the first row to publish, so a batch of refused rows (or none)
    imports no application and opens no broker connection. Envelopes are held to
    ``max_bytes`` (default: the current setting)."""

    def __init__(
        self,
        publish: Publish | None = None,
        *,
        open_publish: Callable[[], Publish] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        if publish is None and open_publish is None:
            raise ValueError("replay needs publish or open_publish")
        self._publish = publish
        self._open_publish = open_publish
        self.max_bytes = max_bytes

    def publisher(self) -> Publish:
        """The publish callable, opened now if not yet. Called outside the publish's error
        handling: an app that cannot be loaded is the caller's error, not a failed publish."""
        if self._publish is None:
            assert self._open_publish is not None
            self._publish = self._open_publish()
        return self._publish


@dataclass(frozen=True)
class Discard:
    """Mark each row ``discarded`` with ``reason`` (stored as ``discard_reason``)."""

    reason: str


class _Row(NamedTuple):
    """A locked row, as every lock query of the step selects it."""

    id: int
    queue: str | None
    kind: str | None
    error_type: str | None
    payload: Any
    headers: Any

    @property
    def group(self) -> Group:
        return Group(self.queue, self.kind, self.error_type)


def _queries() -> dict[str, str]:
    return load_queries("dead_letters")


def replay_refusal(queue: str | None, payload: Any, *, max_bytes: int | None = None) -> str | None:
    """Why a row cannot be replayed, or ``None`` when it can.

    Only a readable envelope with a known queue can be republished as the original job;
    a raw poison message has no envelope to republish. The envelope is held to the same
    rules as a publish (the size limit is ``max_bytes``, default the current setting),
    so a row that publish would refuse is refused here with the reason.
    """
    if not queue:
        return "no original queue recorded"
    if isinstance(payload, dict) and "raw" in payload and "job_id" not in payload:
        return "payload is a raw message, not a readable envelope"
    if isinstance(payload, dict) and ESCAPED_KEY in payload:
        return (
            "payload was stored with escapes, so it is not the original envelope "
            f"({'; '.join(map(str, payload[ESCAPED_KEY]))})"
        )
    try:
        parse_envelope(payload, dict, max_bytes=max_bytes)
    except EnvelopeError as exc:
        return f"payload is not a readable envelope ({exc})"
    return None


def settle_batch(
    conn: Connection,
    lock: str,
    params: Mapping[str, Any],
    action: Replay | Discard,
    *,
    now: datetime | None = None,
    record: Callable[[Cursor, Outcome], None] | None = None,
) -> Outcome:
    """Lock the rows ``lock`` selects, replay or discard them, commit; their outcome.

    ``lock`` is a query (with ``params``) that selects pending rows ``FOR UPDATE`` as
    ``id, queue, kind, error_type, payload, headers``, in id order. ``record`` runs in the
    same transaction after the rows are marked (an operation counts the batch there), so
    the rows and the caller's record of them commit together. A publish that fails stops
    the batch: the rows published before it are marked and committed, and the outcome's
    ``stopped`` names the row and the error for the caller to raise.
    """
    when = now or datetime.now(UTC)
    with conn, conn.cursor() as cur:
        cur.execute(lock, dict(params))
        rows = [_Row(*values) for values in cur.fetchall()]
        outcome = Outcome(locked=[row.id for row in rows])
        if isinstance(action, Replay):
            _replay(cur, rows, action, outcome, when)
        else:
            _discard(cur, rows, action, outcome, when)
        if record is not None:
            record(cur, outcome)
    # Committed: a follow-up of the settled groups (outcome.groups) belongs here.
    _log_settled(outcome, action)
    return outcome


def _replay(
    cur: Cursor, rows: Sequence[_Row], action: Replay, outcome: Outcome, now: datetime
) -> None:
    for row in rows:
        refusal = replay_refusal(row.queue, row.payload, max_bytes=action.max_bytes)
        if refusal:
            outcome.refused.append((row.id, refusal))
            _log_refused(row.id, refusal)
            continue
        assert row.queue is not None  # a row without a queue is refused
        publish = action.publisher()
        in_batch = _batch_of(row.headers)
        if in_batch is not None:  # a batch child counts again; undone if the publish fails
            cur.execute("SAVEPOINT platform_batch_reopen")
            cur.execute(
                _queries()["reopen_batch_child"],
                {"job": str(row.payload["job_id"]), "batch": in_batch},
            )
        try:
            job_id = uuid.UUID(str(_republish(publish, row.queue, row.payload, row.headers)))
        except Exception as exc:
            if in_batch is not None:
                cur.execute("ROLLBACK TO SAVEPOINT platform_batch_reopen")
            outcome.stopped = (row.id, exc)
            break
        outcome.replayed.append(ReplayedRow(row.id, job_id, row.queue))
        outcome.groups.add(row.group)
    if outcome.replayed:
        cur.execute(
            _queries()["mark_replayed"],
            {"ids": [replayed.id for replayed in outcome.replayed], "now": now},
        )


def _batch_of(headers: Any) -> str | None:
    """The batch a stored message named (``platform_batch_id``), ``None`` for none."""
    value = headers.get(BATCH_HEADER) if isinstance(headers, dict) else None
    return value if isinstance(value, str) and value else None


def _republish(publish: Publish, queue: str, payload: Any, headers: Any) -> object:
    """Publish a row again with the trace context and custom headers it was stored with
    (less any name Celery or the platform uses, kept by a row stored before such names
    were refused: it would replace their own header).

    Not with its publish time: a replay is a new publish, so a cancel rule made before
    it (the incident's "cancel, fix, replay") does not take it."""
    if isinstance(headers, dict):
        headers = without_reserved(headers)
    if isinstance(headers, dict) and headers:
        return publish(queue, payload, {"headers": without_publish_time(headers)})
    return publish(queue, payload)


def _discard(
    cur: Cursor, rows: Sequence[_Row], action: Discard, outcome: Outcome, now: datetime
) -> None:
    if not rows:
        return
    outcome.discarded = [row.id for row in rows]
    outcome.groups = {row.group for row in rows}
    cur.execute(
        _queries()["mark_discarded"],
        {"ids": outcome.discarded, "reason": action.reason, "now": now},
    )
    # a batch child's dead letter discarded: its final outcome (it ended already)
    cur.execute(_queries()["discard_batch_children"], {"ids": outcome.discarded})


def _log_settled(outcome: Outcome, action: Replay | Discard) -> None:
    for replayed in outcome.replayed:
        logger.info(
            "dead letter %s replayed as job %s to queue %s",
            replayed.id,
            replayed.job_id,
            replayed.queue,
            extra={
                "event": "dead_letter.replayed",
                "dead_letter_id": replayed.id,
                "job_id": str(replayed.job_id),
                "queue": replayed.queue,
            },
        )
    if isinstance(action, Discard):
        for row_id in outcome.discarded:
            logger.info(
                "dead letter %s discarded: %s",
                row_id,
                action.reason,
                extra={"event": "dead_letter.discarded", "dead_letter_id": row_id},
            )


def _log_refused(row_id: int, why: str) -> None:
    logger.warning(
        "dead letter %s not replayed: %s",
        row_id,
        why,
        extra={"event": "dead_letter.replay_refused", "dead_letter_id": row_id},
    )
