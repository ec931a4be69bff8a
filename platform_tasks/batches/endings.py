"""Counting a child's ending, in the transaction of that ending, and firing what is due.

Every place a job ends calls :func:`count_ending` in the transaction that records the
ending: the handler's (``applied``, beside the idempotency row), the dead letter's
(``dead_lettered``), a cancel's accounting row (``cancelled``: a cancel rule met at
consume time or the ``jobs cancel`` sweep of the delay store). The child's
``core.batch_jobs`` row takes the outcome only if it has none, so a duplicate or a
redelivery counts nothing; its shard's ``remaining`` drops by one. A transaction that
brings a shard to zero locks the batch (row, then advisory lock) and sums the shards:
only the last of them sees zero, and it publishes ``on_complete`` (and ``on_success``
when every child was applied) through the outbox before it commits. The first dead
letter publishes ``on_death`` the same way.

``discarded`` is an operator's decision about a dead letter (``dead-letters discard``):
the child had ended already (dead-lettered), so nothing is counted again; its outcome
becomes ``discarded``, final, and the batch cannot succeed. A replay of a child's dead
letter re-opens the batch in the replay's transaction. Both are done by the dead-letter
step itself (:mod:`platform_tasks.dead_letters.batch`, its SQL in ``dead_letters.sql``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from platform_tasks.batches import store
from platform_tasks.batches.callbacks import fire
from platform_tasks.batches.children import RunningChild, current_child
from platform_tasks.headers import BATCH_HEADER

if TYPE_CHECKING:
    from platform_tasks.publishing.queue_port import QueuePort

__all__ = [
    "PortFactory",
    "batch_child",
    "batch_id_of",
    "complete_if_done",
    "count_applied",
    "count_applied_with_commit",
    "count_ending",
]

logger = logging.getLogger(__name__)

PortFactory = Callable[[], "QueuePort"]
"""Gives the queue port the callbacks are published with (called only when one fires)."""


def batch_id_of(headers: Mapping[str, Any] | None) -> uuid.UUID | None:
    """The batch a message's headers name, ``None`` for a job outside any batch."""
    if not headers:
        return None
    value = headers.get(BATCH_HEADER)
    if not isinstance(value, str) or not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@contextmanager
def batch_child(headers: Mapping[str, Any] | None) -> Iterator[RunningChild | None]:
    """Around a handler's run: the running job's batch (``None`` outside any), which
    :func:`~platform_tasks.batches.api.batch_of` adds children to."""
    batch = batch_id_of(headers)
    if batch is None:
        yield None
        return
    child = RunningChild(batch)
    token = current_child.set(child)
    try:
        yield child
    finally:
        current_child.reset(token)


def count_applied(cur: Any, job_id: uuid.UUID, child: RunningChild, port: PortFactory) -> None:
    """Before the handler's commit: the children it added join the batch, then its own
    ending counts (in that order, so the batch cannot reach zero before they end)."""
    if child.added:
        store.add_jobs(cur, child.batch_id, child.added)
        child.added.clear()
    count_ending(cur, job_id, "applied", port, child.batch_id)


def count_applied_with_commit(cur: Any, job_id: uuid.UUID, child: RunningChild) -> bool:
    """The handler's commit with its ending counted in the same round trip: ``True`` when
    the ``COMMIT`` was sent (the caller checks it committed). ``False`` when nothing was
    sent or counted, the transaction still open: the handler added children (they join
    first), or the ending brought a shard to zero (rolled back to its savepoint): count
    it with :func:`count_applied`, which completes the batch when it is the last, then
    commit."""
    if child.added:
        return False
    return store.end_applied_and_commit(cur, job_id, child.batch_id)


def count_ending(
    cur: Any,
    job_id: uuid.UUID | str,
    outcome: str,
    port: PortFactory,
    batch_id: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """Count the child's ending in ``cur``'s transaction and publish the callbacks it
    makes due; the batches it was counted in (none: no child, or ended already)."""
    counted = store.end_job(cur, job_id, outcome, batch_id)
    for batch, remaining in counted:
        if outcome == "dead_lettered":
            _first_death(cur, batch, port)
        if remaining == 0:
            complete_if_done(cur, batch, port)
    return [batch for batch, _ in counted]


def _first_death(cur: Any, batch_id: uuid.UUID, port: PortFactory) -> None:
    death = store.mark_death(cur, batch_id)
    if death is None:
        return
    spec, created_at = death
    if spec is not None:
        job = fire(port(), cur, "on_death", spec, batch_id, created_at, store.counts(cur, batch_id))
        _log_fired(batch_id, "on_death", job)


def complete_if_done(cur: Any, batch_id: uuid.UUID, port: PortFactory) -> bool:
    """A shard reached zero: lock the batch and, when no child is left, fire what is due.
    Whether the batch was complete."""
    if store.remaining_after_lock(cur, batch_id) != 0:
        return False
    counts = store.counts(cur, batch_id)
    completion = store.mark_complete(cur, batch_id, clean=counts["applied"] == counts["total"])
    if completion is None:  # the batch is gone (deleted)
        return False
    for name, spec in (
        ("on_complete", completion.on_complete),
        ("on_success", completion.on_success),
    ):
        if spec is not None:
            job = fire(port(), cur, name, spec, batch_id, completion.created_at, counts)
            _log_fired(batch_id, name, job)
    return True


def _log_fired(batch_id: uuid.UUID, name: str, job_id: uuid.UUID) -> None:
    logger.info(
        "batch %s: %s published as job %s",
        batch_id,
        name,
        job_id,
        extra={
            "event": "batch.callback_published",
            "batch_id": str(batch_id),
            "callback": name,
            "job_id": str(job_id),
        },
    )
