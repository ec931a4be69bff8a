"""The job's transaction: opened by the claim, and always ended by a commit or a rollback.

The handler gets a cursor inside the transaction that holds the idempotency row, and it
can do things to it the platform must notice: catch a SQL error (PostgreSQL then answers
``COMMIT`` with ``ROLLBACK``), close the cursor or the connection, end the transaction
itself. :meth:`JobTransaction.broken` names what happened, :meth:`JobTransaction.commit`
checks that the commit really committed, and :meth:`JobTransaction.end` (called from a
``finally``) rolls back whatever was left open. A connection whose state is unknown is
discarded, never handed to the next job.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from psycopg2.extensions import (
    TRANSACTION_STATUS_INERROR,
    TRANSACTION_STATUS_INTRANS,
)

from platform_tasks.consumer import idempotency
from platform_tasks.errors import TransactionBroken
from platform_tasks.postgres.database import Database, is_unavailable

logger = logging.getLogger(__name__)

CLOSED_BY_CALL = 1
"""psycopg2's ``connection.closed`` after ``close()`` (2 means the server went away)."""


class JobTransaction:
    """One transaction on this process's connection, begun with the claim of a job."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.conn = database.connection()
        self.cursor: Any = self.conn.cursor()
        self.open = False

    def claim(self, job_id: uuid.UUID, consumer: str) -> bool:
        """``BEGIN`` + insert the idempotency row; ``False`` when the job was applied."""
        self.open = True
        return idempotency.claim(self.cursor, job_id, consumer, begin_transaction=True)

    def claim_and_look(
        self, job_id: uuid.UUID | str, consumer: str, correlation_id: str | None = None
    ) -> tuple[bool, bool]:
        """``BEGIN`` + claim + look for a delivery mark: ``(claimed, marked)``, one round trip.
        ``correlation_id`` is recorded with the claim (for ``jobs list --correlation-id``)."""
        self.open = True
        return idempotency.claim_and_look(self.cursor, job_id, consumer, correlation_id)

    def begin(self) -> None:
        """``BEGIN`` without a claim (a dead letter written on its own)."""
        self.open = True
        self.cursor.execute("BEGIN")

    def broken(self) -> TransactionBroken | None:
        """What the handler did to the transaction, or ``None`` when it is intact."""
        if self.conn.closed == CLOSED_BY_CALL:
            return TransactionBroken("the handler closed the database connection it was given")
        if self.conn.closed:
            return None  # the server went away: waited out, not the handler's doing
        if self.cursor.closed:
            return TransactionBroken("the handler closed the cursor (tx) it was given")
        status = self.conn.info.transaction_status
        if status == TRANSACTION_STATUS_INERROR:
            return TransactionBroken(
                "a statement of the handler failed and the handler went on; the transaction "
                "is aborted, so nothing it wrote can commit"
            )
        if status != TRANSACTION_STATUS_INTRANS:
            return TransactionBroken(
                "the handler ended the transaction it was given (COMMIT or ROLLBACK inside tx)"
            )
        return None

    def handler_closed_it(self) -> bool:
        """Whether the handler closed the cursor or connection (an error, not an outage)."""
        return self.conn.closed == CLOSED_BY_CALL or (not self.conn.closed and self.cursor.closed)

    def server_gone(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by the handler) means PostgreSQL went away."""
        return not self.handler_closed_it() and is_unavailable(exc, self.conn)

    def commit(self) -> TransactionBroken | None:
        """Commit; a problem when PostgreSQL did not commit (it answered ``ROLLBACK``)."""
        self.cursor.execute("COMMIT")
        return self.committed()

    def committed(self) -> TransactionBroken | None:
        """The ``COMMIT`` was the last statement the cursor ran (sent in the round trip of
        a statement before it): the transaction is over; a problem as for :meth:`commit`."""
        self.open = False
        if self.cursor.statusmessage != "COMMIT":
            return TransactionBroken(
                f"PostgreSQL answered COMMIT with {self.cursor.statusmessage}: a statement of "
                "the handler had failed"
            )
        return None

    def rollback(self) -> None:
        """Undo everything since the claim; the connection is discarded if that fails."""
        self.end()

    def end(self) -> None:
        """Leave nothing open: roll back what is still open, else throw the connection away.

        Never raises: this runs in ``finally`` blocks, whatever else was raised.
        """
        if not self.open:
            return
        self.open = False
        try:
            if self.conn.closed:
                raise ConnectionError("connection closed")
            with self.conn.cursor() as cur:
                cur.execute("ROLLBACK")
            if self.conn.info.transaction_status != 0:  # TRANSACTION_STATUS_IDLE
                raise ConnectionError("still in a transaction after ROLLBACK")
        except Exception:
            logger.debug(
                "rollback failed; discarding the connection",
                exc_info=True,
                extra={"event": "consumer.connection_discarded"},
            )
            self.database.discard()
