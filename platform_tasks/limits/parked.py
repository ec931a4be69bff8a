"""Jobs back on their queue that no worker could start now: their concurrency cap is full.

A job refused by its cap goes to the delay store and comes back to its queue when its
``concurrency_retry`` is up; if its key's slots are still all held, the worker that takes
it puts it back again. While it sits on the queue it counts in the queue's length, but a
new worker could not start it: the runnable gauge
(:mod:`platform_tasks.consumer.runnable`) leaves such jobs out.

The refusal recorded each such job in its task's waiting set
(:func:`~platform_tasks.keys.concurrency_waiting_key`: job id, queue, key, scored by the
time it is due back). A scrape reads, for each capped task, the jobs already due back
(at most :data:`READ_LIMIT` per task) and the live leases of their keys: of the ``n`` jobs
of one key, ``cap - held`` could start now and the rest are blocked. Three round trips
whatever the number of tasks and keys, and nothing is written.

What it cannot know: a capped job no worker has tried yet (its key is read from its data
only when it is taken) counts as runnable until its first refusal; a job due back that a
worker has already fetched, or that the delay store has not promoted yet, is counted
blocked though it is not on the queue (the gauge clamps at 0).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from platform_tasks.brokers.server_time import reply_ms
from platform_tasks.keys import concurrency_key, concurrency_waiting_key
from platform_tasks.limits.concurrency import WAITING_GRACE_MS

__all__ = ["READ_LIMIT", "CappedTask", "blocked_on_caps"]

READ_LIMIT = 10_000
"""Jobs due back read per capped task and scrape at most (a few hundred KB): beyond it
the gauge counts the rest as runnable."""


@dataclass(frozen=True)
class CappedTask:
    """A task with a concurrency cap: its registered name and its ``max_concurrency``."""

    name: str
    cap: int


def _member(raw: bytes | str) -> tuple[str, str] | None:
    """``(queue, key)`` of a waiting-set member, ``None`` if it is not one."""
    try:
        _, queue, key = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return (str(queue), str(key)) if isinstance(queue, str) and isinstance(key, str) else None


def blocked_on_caps(
    client: Any, profile: str, tasks: Sequence[CappedTask], *, limit: int = READ_LIMIT
) -> dict[str, int]:
    """Jobs due back from a cap refusal whose key's cap is still full, by queue."""
    if not tasks:
        return {}
    now_ms = reply_ms(client.time())
    pipe = client.pipeline(transaction=False)
    for task in tasks:
        pipe.zrangebyscore(
            concurrency_waiting_key(profile, task.name),
            now_ms - WAITING_GRACE_MS,
            now_ms,
            start=0,
            num=limit,
        )
    due: dict[tuple[int, str], Counter[str]] = {}  # (task index, key) -> jobs by queue
    for index, members in enumerate(pipe.execute()):
        for raw in members:
            parsed = _member(raw)
            if parsed is not None:
                queue, key = parsed
                due.setdefault((index, key), Counter())[queue] += 1
    if not due:
        return {}
    pipe = client.pipeline(transaction=False)
    for index, key in due:
        pipe.zcount(concurrency_key(profile, tasks[index].name, key), f"({now_ms}", "+inf")
    blocked: Counter[str] = Counter()
    for ((index, _), queues), held in zip(due.items(), pipe.execute(), strict=True):
        free = max(0, tasks[index].cap - int(held))
        for queue, count in sorted(queues.items()):
            startable = min(free, count)
            free -= startable
            blocked[queue] += count - startable
    return dict(blocked)
