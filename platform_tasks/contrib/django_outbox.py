"""Publish from Django inside ``transaction.atomic``: the job commits with the request's work.

``delay_on_commit``/``on_commit`` publish after the commit, and lose the job when the
process dies between the two. Here the job is a ``core.outbox`` row inserted through
Django's own connection, in the transaction of the current ``atomic`` block; the relays
of the workers publish it once that transaction committed::

    from django.db import transaction
    from platform_tasks.contrib.django_outbox import atomic_tx

    with transaction.atomic():
        order = Order.objects.create(...)
        port.publish("orders", {...}, tx=atomic_tx())

A view that raises after publishing rolls the row back with everything else: no job.
The ``core`` schema must be migrated in the database of that connection (``using``).
"""

from __future__ import annotations

from typing import Any

from platform_tasks.publishing.outbox import OutboxTransactionError

__all__ = ["atomic_tx"]


def atomic_tx(using: str | None = None) -> Any:
    """The DB-API connection of the ``transaction.atomic`` block running on ``using``
    (default: Django's default database), for ``publish(..., tx=atomic_tx())``.

    Refused (:class:`~platform_tasks.publishing.outbox.OutboxTransactionError`, naming the
    alias) outside an ``atomic`` block, where Django autocommits and the job would not
    wait for anything; in a block already marked for rollback; on a database that is not
    PostgreSQL."""
    from django.db import DEFAULT_DB_ALIAS, transaction

    alias = using or DEFAULT_DB_ALIAS
    connection = transaction.get_connection(alias)
    if connection.vendor != "postgresql":
        raise OutboxTransactionError(
            f"atomic_tx(using={alias!r}): the outbox lives in PostgreSQL, this database "
            f"is {connection.vendor}"
        )
    if not connection.in_atomic_block:
        raise OutboxTransactionError(
            f"atomic_tx(using={alias!r}) must be called inside transaction.atomic(): "
            "outside it Django autocommits each statement"
        )
    if connection.needs_rollback:
        raise OutboxTransactionError(
            f"atomic_tx(using={alias!r}): the atomic block is marked for rollback (an "
            "error inside it was caught); nothing published in it could commit"
        )
    connection.ensure_connection()
    return connection.connection
