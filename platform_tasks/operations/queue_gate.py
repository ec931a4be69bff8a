"""Who holds a worker's consumer of a queue cancelled: one gate for every reason.

Two things stop a worker fetching from a queue at runtime: the marketing yield (the
transactional queue of the channel is deep) and an operator's pause. Each used to cancel
and re-add the consumer itself, so one resuming would undo the other's pause. Here each
reason *holds* the queue: the consumer is cancelled when the first hold is taken and
added back only when the last is released. Runs on the consumer's event loop (call it
through ``c.call_soon``), like Celery's ``cancel_consumer``/``add_consumer`` commands.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["held", "hold", "holds", "release"]

logger = logging.getLogger(__name__)

_ATTRIBUTE = "platform_queue_holds"


def holds(c: Any) -> dict[str, set[str]]:
    """The holds of consumer ``c``: queue → reasons it is not consumed."""
    found: dict[str, set[str]] | None = getattr(c, _ATTRIBUTE, None)
    if found is None:
        found = {}
        setattr(c, _ATTRIBUTE, found)
    return found


def held(c: Any, queue: str) -> bool:
    return bool(holds(c).get(queue))


def hold(c: Any, queue: str, reason: str) -> None:
    """Stop consuming ``queue`` for ``reason`` (cancels the consumer at the first hold)."""
    reasons = holds(c).setdefault(queue, set())
    first = not reasons
    reasons.add(reason)
    if first:
        c.cancel_task_queue(queue)
        logger.debug("consumer of %s cancelled (%s)", queue, reason,
                     extra={"event": "consumer.queue_held", "queue": queue,
                            "reason": reason})  # fmt: skip


def release(c: Any, queue: str, reason: str) -> None:
    """Drop ``reason``'s hold; the consumer comes back when no reason holds the queue."""
    reasons = holds(c).get(queue)
    if not reasons or reason not in reasons:
        return
    reasons.discard(reason)
    if not reasons:
        del holds(c)[queue]
        c.add_task_queue(queue)
        logger.debug("consumer of %s added back (%s released it)", queue, reason,
                     extra={"event": "consumer.queue_released", "queue": queue,
                            "reason": reason})  # fmt: skip
    else:
        logger.debug("%s released %s; still held by %s", reason, queue, ", ".join(sorted(reasons)),
                     extra={"event": "consumer.queue_still_held", "queue": queue,
                            "reason": reason})  # fmt: skip
