"""Idempotency rows: "consumer C has applied job J", written in the work's own transaction.

The row is inserted first, inside the transaction the handler then writes in, and both
commit together. A second delivery of the same job either finds the committed row (and is
skipped) or blocks on the uncommitted one until the first delivery commits or rolls back,
so two deliveries running at once never both apply. A handler that raises rolls back its
writes and the row together, leaving the job free to run again.
"""

from __future__ import annotations

import uuid
from typing import Any

from platform_tasks.postgres.database import begin

_CLAIM = (
    "INSERT INTO core.processed_jobs (job_id, consumer) VALUES (%s, %s) "
    "ON CONFLICT (job_id, consumer) DO NOTHING RETURNING 1"
)
# migration 0004: the claim and the look in one function, planned once per session
_CLAIM_AND_LOOK = "SELECT claimed, marked FROM core.claim_delivery(%(job)s, %(consumer)s)"
# migration 0011: the same, recording the job's correlation id in the claimed row
_CLAIM_AND_LOOK_CORRELATED = (
    "SELECT claimed, marked FROM core.claim_delivery(%(job)s, %(consumer)s, %(correlation)s)"
)
_RELEASE = "DELETE FROM core.processed_jobs WHERE job_id = %s AND consumer = %s"


def claim(
    cursor: Any, job_id: uuid.UUID, consumer: str, *, begin_transaction: bool = False
) -> bool:
    """Insert the row in the cursor's transaction; ``False`` means already applied.

    One round trip; with ``begin_transaction`` (an autocommit connection) the ``BEGIN``
    that opens the transaction travels in that same round trip. The row stays
    uncommitted (and locked against other deliveries) until the caller commits or rolls
    back.
    """
    params = (str(job_id), consumer)
    if begin_transaction:
        begin(cursor, _CLAIM, params)
    else:
        cursor.execute(_CLAIM, params)
    return cursor.fetchone() is not None


def claim_and_look(
    cursor: Any, job_id: uuid.UUID | str, consumer: str, correlation_id: str | None = None
) -> tuple[bool, bool]:
    """``BEGIN``, claim, and look for a delivery mark, in one round trip: ``(claimed, marked)``.

    For an autocommit connection (the ``BEGIN`` opens the transaction). Both run in
    ``core.claim_delivery`` (migration 0004), whose look is a query of its own after the
    claim, so under READ COMMITTED its snapshot is taken once the claim was granted: a mark
    committed by a delivery that held the claim before is seen. Under another isolation
    level the snapshot would be older, so ``marked`` is then always true (the caller reads
    the job's state in Redis, as without marks). A dead letter for the job counts as a mark.
    With ``correlation_id`` the claimed row records it (migration 0011's overload).
    """
    params = {"job": str(job_id), "consumer": consumer}
    if correlation_id is None:
        begin(cursor, _CLAIM_AND_LOOK, params)
    else:
        begin(cursor, _CLAIM_AND_LOOK_CORRELATED, {**params, "correlation": correlation_id})
    row = cursor.fetchone()
    return bool(row[0]), bool(row[1])


def release(cursor: Any, job_id: uuid.UUID, consumer: str) -> None:
    """Delete the row claimed in this same transaction.

    Used when the job is dead-lettered instead of applied: the claim kept concurrent
    deliveries waiting while the dead letter was written, and releasing it keeps a later
    replay of the job free to run.
    """
    cursor.execute(_RELEASE, (str(job_id), consumer))


def is_processed(cursor: Any, job_id: uuid.UUID, consumer: str) -> bool:
    """Whether the job's row is committed (a read, for tests and tooling)."""
    cursor.execute(
        "SELECT 1 FROM core.processed_jobs WHERE job_id = %s AND consumer = %s",
        (str(job_id), consumer),
    )
    return cursor.fetchone() is not None
