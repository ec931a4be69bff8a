"""Bulk replay and discard of every pending dead letter matching a filter.

One operation is one ``core.operations`` row. It walks the matching pending rows in id
order, ``batch_size`` per transaction, through the batch step replay and discard by id use
too (:func:`~platform_tasks.dead_letters.batch.settle_batch`): lock the batch with ``FOR
UPDATE SKIP LOCKED``, publish (replay, with each row's stored headers) or mark (discard)
each row, mark them, add the batch to the operation's counts and move its ``last_id`` —
all in that one transaction. So:

- two operations running the same filter at once never act on the same row: a row the
  other holds is skipped, a row it committed is no longer pending;
- a crash loses at most the batch in flight (rolled back; for a replay its publishes
  may have happened, and the consumer's idempotency row makes the republish harmless);
- rerunning the same kind and filter finds the unfinished (``running``) operation and
  continues it from ``last_id`` instead of starting a new one.

Memory holds one batch whatever the number of rows.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from psycopg2.extensions import connection as Connection
from psycopg2.extensions import cursor as Cursor

from platform_tasks.dead_letters.batch import (
    Discard,
    Group,
    Outcome,
    Publish,
    Replay,
    replay_refusal,
    settle_batch,
)
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.errors import ReplayError
from platform_tasks.operations.bulk_run import (
    BulkRun,
    check_filter,
    finish_run,
    operation_queries,
    operation_run,
)
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.operations.log import (
    Operation,
    connect,
)
from platform_tasks.operations.publisher import ReplayPublisher
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "BULK_BATCH_SIZE",
    "REFUSED_KEPT",
    "BatchCallback",
    "BulkResult",
    "Preview",
    "bulk_discard",
    "bulk_replay",
    "iter_matching",
    "preview_dead_letters",
]

logger = logging.getLogger(__name__)

BULK_BATCH_SIZE = 500
"""Rows locked, acted on and committed per transaction."""

REFUSED_KEPT = 100
"""Refused rows a :class:`BulkResult` lists by id (all are counted in ``failed``)."""

BatchCallback = Callable[[Outcome], None]
"""Called with the outcome of each committed batch of a bulk replay."""


@dataclass(frozen=True)
class Preview:
    """What a bulk action would act on now: the count of matching pending rows and the
    oldest ``sample_size`` of them (payload left out, ``last_error`` cut to its start)."""

    matched: int
    sample: list[DeadLetter]


@dataclass(frozen=True)
class BulkResult:
    """The finished (or, on error, last committed) state of one bulk operation."""

    operation: Operation
    resumed: bool
    """True when this run continued an unfinished operation of the same kind and filter."""
    refused: list[tuple[int, str]] = field(default_factory=list)
    """``(id, why)`` of rows this run left pending because they cannot be replayed
    (at most :data:`REFUSED_KEPT`; the operation's ``failed`` count has them all)."""
    groups: frozenset[Group] = frozenset()
    """The ``(queue, kind, error type)`` groups of the rows this run replayed or discarded."""


def preview_dead_letters(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    sample_size: int = 20,
    conn: Connection | None = None,
) -> Preview:
    """Count the pending rows matching ``where`` and return the oldest ``sample_size``.

    Nothing is locked or changed; the ``--dry-run`` of the CLI and the console's
    confirmation page show this. Needs ``settings.database_url``.
    """
    if sample_size < 0:
        raise ValueError(f"sample_size must be >= 0, got {sample_size}")
    with connect(settings, conn) as db, db, db.cursor() as cur:
        cur.execute(operation_queries()["count_matching"], where.params())
        row = cur.fetchone()
        matched = int(row[0]) if row else 0
        sample: list[DeadLetter] = []
        if sample_size and matched:
            cur.execute(
                operation_queries()["sample_matching"], {**where.params(), "limit": sample_size}
            )
            names = [column[0] for column in cur.description or ()]
            sample = [DeadLetter.from_row(names, values) for values in cur.fetchall()]
    return Preview(matched, sample)


def iter_matching(
    conn: Connection, where: OperationFilter, *, max_bytes: int | None = None
) -> Iterator[tuple[int, uuid.UUID | None, str | None, str | None]]:
    """Every pending row matching ``where``, oldest first, as ``(id, job id, queue, why
    not replayable or None)``: what a replay would do, for a dry run. Streams through a
    server-side cursor in one read-only transaction (one batch of payloads in memory)."""
    with conn, conn.cursor(name="platform_operations_dry_run") as cur:
        cur.itersize = BULK_BATCH_SIZE
        cur.execute(operation_queries()["stream_matching"], where.params())
        for row_id, queue, payload in cur:
            refusal = replay_refusal(queue, payload, max_bytes=max_bytes)
            job_id = None if refusal else uuid.UUID(str(payload["job_id"]))
            yield int(row_id), job_id, queue, refusal


def _advance(cur: Cursor, run: BulkRun, *, done: int, failed: int, last_id: int) -> None:
    cur.execute(
        operation_queries()["advance"],
        {"id": run.operation.id, "done": done, "failed": failed, "last_id": last_id},
    )
    run.after_id = last_id


def _note_skipped(cur: Cursor, run: BulkRun, locked: Sequence[int], batch_size: int) -> None:
    """Remember the matching rows of this batch's id range that it could not lock.

    Called before :func:`_advance` moves ``after_id``: the range is ``(after_id, last
    locked id]``, or up to ``max_id`` for the last batch (fewer rows than the limit)."""
    upto = locked[-1] if len(locked) >= batch_size else run.max_id
    cur.execute(
        operation_queries()["skipped_in_range"],
        {**run.where.params(), "after_id": run.after_id, "upto_id": upto, "locked": list(locked)},
    )
    seen = set(run.skipped)  # a short last batch and the empty one after it share a range
    run.skipped.extend(int(row[0]) for row in cur.fetchall() if int(row[0]) not in seen)


def _walk(
    db: Connection,
    run: BulkRun,
    action: Replay | Discard,
    batch_size: int,
    now: datetime | None,
    on_batch: BatchCallback | None = None,
) -> None:
    """Settle every matching row: the walk in id order, then the rows it skipped because
    another transaction held them (waiting for it, so a row it rolls back is acted on
    before the operation reports its outcome)."""
    payloads = isinstance(action, Replay)
    while True:
        params = {**run.where.params(), "after_id": run.after_id, "max_id": run.max_id}
        params.update(limit=batch_size, payloads=payloads)
        batch = settle_batch(
            db,
            operation_queries()["lock_batch"],
            params,
            action,
            now=now,
            record=lambda cur, batch: _record(cur, run, batch, batch_size, walking=True),
        )
        if not batch.locked:
            break
        _settled(run, action, batch, on_batch)
    while run.skipped:
        batch = settle_batch(
            db,
            load_queries("dead_letters")["lock_pending"],
            {"ids": _take_skipped(run, batch_size), "payloads": payloads},
            action,
            now=now,
            record=lambda cur, batch: _record(cur, run, batch, batch_size, walking=False),
        )
        if batch.locked:
            _settled(run, action, batch, on_batch)


def _record(cur: Cursor, run: BulkRun, batch: Outcome, batch_size: int, *, walking: bool) -> None:
    """Count the batch in the operation, in the batch's transaction. ``walking``: the rows
    are the walk's next batch, so its ``last_id`` moves past them (or to just before a row
    whose publish failed); revisited skipped rows leave it where it is."""
    if walking:
        _note_skipped(cur, run, batch.locked, batch_size)
    if not batch.locked:
        return
    last_id = run.after_id
    if walking:
        last_id = batch.stopped[0] - 1 if batch.stopped is not None else batch.locked[-1]
    done = len(batch.replayed) + len(batch.discarded)
    _advance(cur, run, done=done, failed=len(batch.refused), last_id=last_id)


def _settled(
    run: BulkRun, action: Replay | Discard, batch: Outcome, on_batch: BatchCallback | None
) -> None:
    """After a batch committed: keep what the run reports, log it, raise a failed publish."""
    run.groups |= batch.groups
    run.refused.extend(batch.refused[: max(0, REFUSED_KEPT - len(run.refused))])
    kind = "replay" if isinstance(action, Replay) else "discard"
    done = len(batch.replayed) + len(batch.discarded)
    _log_batch(run, kind, done, len(batch.refused), batch.locked[0], batch.locked[-1])
    if on_batch is not None:
        on_batch(batch)
    if batch.stopped is not None:
        row_id, cause = batch.stopped
        raise ReplayError(row_id, [r.id for r in batch.replayed], cause) from cause


def _take_skipped(run: BulkRun, batch_size: int) -> list[int]:
    taken, run.skipped = run.skipped[:batch_size], run.skipped[batch_size:]
    return taken


def bulk_replay(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    actor: str | None = None,
    app: PlatformCelery | None = None,
    publish: Publish | None = None,
    open_publish: Callable[[], Publish] | None = None,
    batch_size: int = BULK_BATCH_SIZE,
    allow_empty_filter: bool = False,
    operation_id: int | None = None,
    on_batch: BatchCallback | None = None,
    conn: Connection | None = None,
    now: datetime | None = None,
) -> BulkResult:
    """Republish every pending dead letter matching ``where`` to its original queue, with
    its original job id and the trace context and custom headers it was stored with, and
    mark it ``replayed``; one recorded operation.

    Publishing uses, in order of preference: ``publish`` (a callable ``(queue, envelope)``),
    ``open_publish`` (called once, at the first row to publish), else a
    :class:`~platform_tasks.operations.publisher.ReplayPublisher` of ``app`` (a platform
    Celery app, for custom routing) or of ``settings`` alone (broker, delay store), like
    ``platform-tasks dead-letters replay``. Rows without a readable envelope stay pending
    and are counted as ``failed``.

    An empty filter means every pending row and is refused unless ``allow_empty_filter``.
    ``actor`` defaults to :func:`~platform_tasks.operations.log.default_actor`. If an
    unfinished replay with the same filter exists whose process is gone, it is continued
    (``resumed=True``); ``operation_id`` continues that operation explicitly (with its
    stored filter; ``where`` may then be empty). A publish that fails ends the operation as
    ``failed`` after committing what was published before it, then raises
    :class:`~platform_tasks.errors.ReplayError`. ``on_batch`` is called after each
    committed batch with its :class:`~platform_tasks.dead_letters.batch.Outcome` (a CLI
    prints its rows as it goes; nothing is kept across batches). Needs
    ``settings.database_url`` and the broker settings.
    """
    check_filter(where, batch_size, allow_empty_filter, operation_id)
    with ReplayPublisher(settings, app=app) as publisher:
        action = Replay(
            publish,
            open_publish=open_publish or publisher.open,
            max_bytes=settings.max_payload_bytes,
        )
        with operation_run(settings, conn, "replay", where, actor, operation_id) as (db, run):
            _walk(db, run, action, batch_size, now, on_batch)
            operation = finish_run(db, run)
    return BulkResult(operation, run.resumed, run.refused, frozenset(run.groups))


def _log_batch(run: BulkRun, kind: str, done: int, failed: int, first: int, last: int) -> None:
    logger.info(
        "operation %s (%s): batch of ids %d..%d, %d done, %d failed",
        run.operation.id,
        kind,
        first,
        last,
        done,
        failed,
        extra={
            "event": "operations.batch",
            "operation_id": run.operation.id,
            "kind": kind,
            "done": done,
            "failed": failed,
            "first_id": first,
            "last_id": last,
        },
    )


def bulk_discard(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    reason: str,
    actor: str | None = None,
    batch_size: int = BULK_BATCH_SIZE,
    allow_empty_filter: bool = False,
    operation_id: int | None = None,
    conn: Connection | None = None,
    now: datetime | None = None,
) -> BulkResult:
    """Mark every pending dead letter matching ``where`` ``discarded`` with ``reason``
    (stored as ``discard_reason``, suffixed with the operation id); one recorded
    operation, batched, concurrent-safe and resumable like :func:`bulk_replay`.
    Needs ``settings.database_url`` only.
    """
    if not reason or not reason.strip():
        raise ValueError("a discard needs a reason (--reason)")
    check_filter(where, batch_size, allow_empty_filter, operation_id)
    with operation_run(settings, conn, "discard", where, actor, operation_id) as (db, run):
        action = Discard(f"{reason.strip()} (operation {run.operation.id})")
        _walk(db, run, action, batch_size, now)
        operation = finish_run(db, run)
    return BulkResult(operation, run.resumed, [], frozenset(run.groups))
