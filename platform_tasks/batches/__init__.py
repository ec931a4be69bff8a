"""Batches: one callback after every job of a group has ended, counted in PostgreSQL.

A batch's children are published through the outbox in the caller's transaction, beside
the batch's row (:mod:`~platform_tasks.batches.api`); each child's ending is counted in
the transaction of that ending (:mod:`~platform_tasks.batches.endings`), and the
transaction that counts the last ending publishes the callbacks, through the outbox, in
that same transaction (:mod:`~platform_tasks.batches.callbacks`). The SQL is in
``platform_tasks/sql/batches.sql`` (:mod:`~platform_tasks.batches.store`).
"""

from __future__ import annotations

from platform_tasks.batches.api import Batch, batch_of
from platform_tasks.batches.callbacks import Callback
from platform_tasks.batches.children import NotInBatchError

__all__ = ["Batch", "Callback", "NotInBatchError", "batch_of"]
