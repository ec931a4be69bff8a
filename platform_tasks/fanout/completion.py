"""Fan-out completion: ``fan_out(..., on_complete=)`` fires once every tenant's job of the
point has ended, the "all tenants done" a cron fan-out otherwise lacks.

Such a fan-out is a batch (:mod:`platform_tasks.batches`) whose id is the fan-out job's
id and whose children are the tenants' jobs. The fan-out job builds it as it publishes:

1. its first delivery creates the batch with the fan-out job itself as its first child
   (tenant ``platform``, kind ``platform.fanout``), committed at once;
2. before each page of tenants is published, the page's jobs join the batch in a
   committed transaction of their own, so a tenant's job that ends at once finds its
   row and is counted (in its own transaction, like any batch child: the message carries
   the ``platform_batch_id`` header);
3. once every page is published, the fan-out job's own ending is counted in the fan-out
   job's transaction, beside its idempotency row.

The fan-out job's row keeps the batch open between pages: however fast the tenants'
jobs end, the batch reaches zero only after the last page joined, so ``on_complete``
fires once, after the last tenant's job ended, through the outbox of the transaction
that counted that ending. A delivery killed between a page's join and its publish is
resumed from the progress marker (before that page): the page joins again (a child
added twice counts once) and is published again with the same job ids (which the
tenants' consumers absorb, and which count once). A fan-out that is dead-lettered
leaves its batch open: the stall watchdog reports it, and a replay resumes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg2

from platform_tasks.batches import store
from platform_tasks.batches.api import DEFAULT_SHARDS
from platform_tasks.batches.endings import count_ending
from platform_tasks.envelope import Envelope
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FANOUT_TENANT
from platform_tasks.headers import BATCH_HEADER

__all__ = ["FanOutBatch", "batch_headers", "count_fan_out_ended"]


def batch_headers(batch_id: uuid.UUID | None) -> dict[str, str]:
    """The headers every tenant job of the fan-out carries (none without a batch)."""
    return {} if batch_id is None else {BATCH_HEADER: str(batch_id)}


class FanOutBatch:
    """The batch of one fan-out job, written on a connection of its own (each step
    commits at once: the fan-out job's own transaction commits only at its end)."""

    def __init__(self, database_url: str, fan_out_job_id: uuid.UUID) -> None:
        self.batch_id = fan_out_job_id
        self.fan_out_job_id = fan_out_job_id
        self._conn = psycopg2.connect(
            database_url, connect_timeout=10, application_name="platform-tasks fan-out"
        )

    def ensure(self, *, on_complete: Mapping[str, Any], profile: str, description: str) -> None:
        """Create the batch with the fan-out job as its first child, unless an earlier
        delivery did. Two deliveries at once: one insert fails (primary key) and that
        delivery is retried; nothing is written twice."""
        with self._conn, self._conn.cursor() as cur:
            if store.shards_of(cur, self.batch_id) is None:
                store.create_batch(
                    cur,
                    self.batch_id,
                    profile=profile,
                    description=description,
                    shards=DEFAULT_SHARDS,
                    callbacks={"on_complete": on_complete, "on_success": None, "on_death": None},
                )
            store.add_jobs(
                cur,
                self.batch_id,
                [store.ChildRow(self.fan_out_job_id, FANOUT_QUEUE, FANOUT_KIND, FANOUT_TENANT)],
            )

    def add(self, queue: str, envelopes: Sequence[Envelope[Any]]) -> None:
        """The page's tenant jobs join the batch (committed before they are published)."""
        rows = [store.ChildRow(e.job_id, queue, e.kind, e.tenant_id) for e in envelopes]
        with self._conn, self._conn.cursor() as cur:
            store.add_jobs(cur, self.batch_id, rows)

    def close(self) -> None:
        self._conn.close()


def count_fan_out_ended(cur: Any, fan_out_job_id: uuid.UUID, port: Callable[[], Any]) -> None:
    """Every page is published: the fan-out job's own ending counts, in its transaction
    (``cur``); when every tenant's job had ended already, ``on_complete`` fires here."""
    count_ending(cur, fan_out_job_id, "applied", port, fan_out_job_id)
