"""Delivery marks: "this job has delivery state in Redis", committed in PostgreSQL first.

A first delivery of a healthy job has nothing in Redis to read, yet reading it cost one
Redis round trip per job. Every write of a job's delivery hash (a failed attempt, a
counted redelivery, a replay restart, a dead letter) is now preceded by a row in
``core.delivery_marks``, committed on a connection of its own (the job's transaction may
roll back; the mark must not). The claim of the next delivery reads the mark in its own
round trip, with a snapshot taken after the claim was granted
(:func:`platform_tasks.consumer.idempotency.claim_and_look`): a copy that waited on the claim of a
failing copy sees that copy's mark, as it saw its Redis count. No mark and not
redelivered means the Redis hash does not exist, so the read is skipped; anything else
reads it as before.

The read is skipped (:func:`reads_can_skip`) when the platform's Redis is the broker: the
delivery came from that server and its ack goes back to it, so an outage of it already
holds the message unacked (a job applied meanwhile is redelivered and found applied by
its claim). It is skipped on RabbitMQ too: the broker itself sets ``redelivered`` on
every message it delivered before, and a first delivery without a mark needs nothing
from Redis, so during an outage of the platform's Redis a RabbitMQ worker goes on
applying healthy first deliveries while every delivery that needs Redis (a redelivery,
a job with a mark, a failed attempt to count) waits unacked. With a Redis Cluster or a
separate Redis broker in front of a single platform Redis, every delivery still reads
it and waits while it is down (``tests/e2e/consumer/test_redis_cluster_outage.py``).
"""

from __future__ import annotations

import uuid
from typing import Any

from platform_tasks.brokers.selection import broker_kind
from platform_tasks.postgres.database import Database

_MARK = (
    "INSERT INTO core.delivery_marks (job_id, consumer) VALUES (%s, %s) "
    "ON CONFLICT (job_id, consumer) DO NOTHING"
)


class DeliveryMarks:
    """Writes marks on an autocommit connection of its own (opened at the first mark)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @classmethod
    def beside(cls, database: Database) -> DeliveryMarks:
        """Marks on a second connection to the same database as ``database``."""
        return cls(
            Database(database.url, connect_timeout=database.connect_timeout, autocommit=True)
        )

    def mark(self, consumer: str, job_id: str) -> None:
        """Commit the mark of ``(job_id, consumer)``; raises when PostgreSQL cannot."""
        try:
            with self.database.connection().cursor() as cur:
                cur.execute(_MARK, (str(uuid.UUID(job_id)), consumer))
        except Exception:
            self.database.discard()
            raise


def reads_can_skip(settings: Any) -> bool:
    """Whether a first delivery without a mark may skip the Redis read (see the module)."""
    if broker_kind(settings.effective_broker_url) == "amqp":
        return True
    return not settings.redis_cluster and settings.effective_broker_url == settings.redis_url
