"""The batch of the child job running in this context, and the children it adds.

The consumer pipeline sets :data:`current_child` around the handler of a job whose
message names a batch (:func:`~platform_tasks.batches.endings.batch_child`);
:func:`~platform_tasks.batches.api.batch_of` adds children to it, and they join the batch
in the child's transaction just before its own ending is counted there.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field

from platform_tasks.batches.store import ChildRow
from platform_tasks.errors import PlatformError

__all__ = ["NotInBatchError", "RunningChild", "current_child"]


class NotInBatchError(PlatformError, LookupError):
    """``batch_of`` was called where no batch child is running."""


@dataclass
class RunningChild:
    """The running child's batch, and the children it added (not joined yet)."""

    batch_id: uuid.UUID
    added: list[ChildRow] = field(default_factory=list)


current_child: ContextVar[RunningChild | None] = ContextVar(
    "platform_current_batch_child", default=None
)
"""Set by the consumer pipeline around the handler of a job that belongs to a batch."""
