"""The queue port's batch: children published atomically with the batch, and a running
child adding children to its own batch.

``with port.batch(on_complete=..., tx=conn) as batch: batch.publish(queue, payload)``
inserts the batch's row, each child's outbox row (the message carries the
``platform_batch_id`` header) and, when the block ends, the children's
``core.batch_jobs`` rows and shard counts, all in the caller's transaction: rolled back,
neither the batch nor any child ever existed. Inside a PlatformTask handler the default
``tx`` is the handler's, as for ``publish``.

A running child adds children to its own batch with :func:`batch_of` (``batch_of(port)
.publish(...)``): they join the batch in the child's transaction, before its own ending
is counted there, so the batch cannot complete before they end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from platform_tasks.batches import store
from platform_tasks.batches.callbacks import CALLBACK_NAMES, checked_spec
from platform_tasks.batches.children import NotInBatchError, RunningChild, current_child
from platform_tasks.batches.endings import complete_if_done
from platform_tasks.envelope import uuid7

if TYPE_CHECKING:
    from platform_tasks.publishing.outbox import HandlerTransaction
    from platform_tasks.publishing.queue_port import PublishOptions, QueuePort

__all__ = [
    "DEFAULT_SHARDS",
    "MAX_SHARDS",
    "Batch",
    "NotInBatchError",
    "RunningChild",
    "batch_of",
    "current_child",
    "open_batch",
]

_PORTS_DEFAULT: Any = object()
"""A :class:`Batch`'s ``tx`` when its children take the port's default ``tx`` (inside a
handler: the handler's transaction, with derived ids)."""

DEFAULT_SHARDS = 32
"""Rows a batch's remaining count is spread over: children ending at once rarely meet
on one (a transaction holds its shard's row lock only from its count to its commit)."""
MAX_SHARDS = 1024


class Batch:
    """A batch being filled: :meth:`publish` and :meth:`schedule` add a child."""

    def __init__(
        self,
        port: QueuePort,
        batch_id: uuid.UUID,
        tx: Any,
        children: list[store.ChildRow],
    ) -> None:
        self.port = port
        self._id = batch_id
        self._tx = tx
        self.children = children
        """The children added through this object so far (joined at the block's end, or
        at the running child's commit)."""

    @property
    def id(self) -> uuid.UUID:
        """The batch id (``core.batches.batch_id``, the ``platform_batch_id`` header)."""
        return self._id

    def publish(
        self,
        queue: str,
        payload: Mapping[str, Any],
        opts: Mapping[str, Any] | PublishOptions | None = None,
    ) -> uuid.UUID:
        """Publish a child (through the outbox, in the batch's transaction); its job id."""
        return self._add(queue, payload, opts, None)

    def schedule(
        self,
        queue: str,
        payload: Mapping[str, Any],
        run_at: datetime,
        opts: Mapping[str, Any] | PublishOptions | None = None,
    ) -> uuid.UUID:
        """Schedule a child for ``run_at`` (aware); it counts as outstanding until it ends."""
        return self._add(queue, payload, opts, run_at)

    def _add(
        self,
        queue: str,
        payload: Mapping[str, Any],
        opts: Mapping[str, Any] | PublishOptions | None,
        run_at: datetime | None,
    ) -> uuid.UUID:
        given = {} if self._tx is _PORTS_DEFAULT else {"tx": self._tx}
        envelope = self.port.publish_child(queue, payload, opts, run_at, self._id, **given)
        self.children.append(
            store.ChildRow(envelope.job_id, queue, envelope.kind, envelope.tenant_id)
        )
        return envelope.job_id


@contextmanager
def open_batch(
    port: QueuePort,
    cur: Any,
    handler: HandlerTransaction | None,
    *,
    callbacks: Mapping[str, Any],
    description: str = "",
    shards: int = DEFAULT_SHARDS,
) -> Iterator[Batch]:
    """The body of :meth:`~platform_tasks.publishing.queue_port.QueuePort.batch`, in the
    transaction of ``cur`` (``handler``: the running handler's, whose publishes it joins)."""
    if not isinstance(description, str):
        raise TypeError(f"description must be a string, got {type(description).__name__}")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer from 1 to {MAX_SHARDS}, got {shards!r}")
    specs = {name: checked_spec(name, callbacks.get(name), port) for name in CALLBACK_NAMES}
    batch_id = uuid7() if handler is None else handler.child_job_id()
    store.create_batch(
        cur,
        batch_id,
        profile=port.settings.profile,
        description=description,
        shards=shards,
        callbacks=specs,
    )
    batch = Batch(port, batch_id, _PORTS_DEFAULT if handler is not None else cur, [])
    yield batch
    store.add_jobs(cur, batch_id, batch.children)
    if not batch.children:  # nothing to wait for: complete (and clean) at once
        complete_if_done(cur, batch_id, lambda: port)


def batch_of(port: QueuePort) -> Batch:
    """The batch of the child job running here, to add children to it (they join it in
    the child's transaction, so the batch waits for them). Only inside the handler of a
    batch child; :class:`NotInBatchError` elsewhere."""
    child = current_child.get()
    if child is None:
        raise NotInBatchError(
            "batch_of() is for the handler of a job that belongs to a batch; this job "
            "carries no platform_batch_id header"
        )
    return Batch(port, child.batch_id, _PORTS_DEFAULT, child.added)
