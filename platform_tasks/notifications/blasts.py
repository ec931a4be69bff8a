"""``publish_blast``: a recipient stream as marketing jobs of at most 100 recipients.

The recipients are read chunk by chunk (an iterator of a million rows is never held
whole) and each chunk becomes one job on the channel's marketing rail, whose render
handler returns one email per recipient: one batch request to the provider.

Identity is per recipient. A chunk holds distinct recipients (by
:func:`~platform_tasks.notifications.blast_recipients.recipient_identity`) in canonical
order, and its job id is a hash of ``(tenant, campaign, its recipients' identities)``:
the same chunk published again is the same job, applied once. Which chunk a recipient
lands in depends on the order and the other recipients, so the guarantee does not rest
on the ids: each chunk job claims its recipients for the campaign in its own
transaction (``core.blast_recipients``) and sends only to those it claimed. A campaign
published again, reordered, with recipients added or removed, reaches every recipient
of every publish, each at most once.

Back-pressure: at most ``max_in_flight`` of a blast's jobs are published and not yet
settled (applied or dead-lettered, read from ``core.processed_jobs`` and
``core.dead_letters``); beyond that the publisher waits. Counting settled jobs rather
than the queue's depth bounds what the blast holds in the broker *and* in the delay
store, where marketing jobs refused by the rate limits wait (workers move a queue into
the delay store far faster than the provider drains it).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import psycopg2

from platform_tasks.errors import ConfigurationError
from platform_tasks.notifications.blast_recipients import recipient_identity
from platform_tasks.notifications.rails import MARKETING, notification_queue
from platform_tasks.postgres.queries import load_queries

__all__ = ["MAX_CHUNK", "MAX_IN_FLIGHT", "blast_job_id", "publish_blast"]

logger = logging.getLogger(__name__)

MAX_CHUNK = 100
"""Resend's batch limit: one chunk is one batch request."""

MAX_IN_FLIGHT = 1000
"""Default bound of a blast's jobs published and not yet settled (100,000 recipients in
chunks of 100). A 100-recipient job holds about 6 KiB of Redis (measured in
BENCHMARKS.md: a 1,000,000-recipient blast peaked at 5.9 MiB above the baseline with this
bound, 49.8 MiB without), so a blast of any size holds a few MiB; and 1000 jobs are
minutes of work at any provider rate a marketing rail gets (200 s at 5 requests/s, 20 s
at 50/s), far more than the :data:`WAIT_INTERVAL_SECONDS` between two looks, so the
bound never leaves the workers without work."""

WAIT_INTERVAL_SECONDS = 0.5
"""How often a publisher at its bound asks PostgreSQL which of its jobs settled."""


def blast_job_id(tenant_id: str, campaign_id: str, identities: Iterable[str]) -> uuid.UUID:
    """A UUID of version 7 derived from the tenant, the campaign and a chunk's recipients.

    ``identities`` are the chunk's recipient identities in any order (they are sorted
    here): the same recipients give the same id every time.
    """
    digest = hashlib.sha256(f"blast\0{tenant_id}\0{campaign_id}".encode())
    for identity in sorted(identities):
        digest.update(b"\0" + identity.encode())
    raw = bytearray(digest.digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x70  # version 7
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 9562 variant
    return uuid.UUID(bytes=bytes(raw))


def _chunks(recipients: Iterable[Any], size: int) -> Iterator[dict[str, Any]]:
    """Chunks of ``size`` distinct recipients, keyed by identity, in canonical order."""
    chunk: dict[str, Any] = {}
    for recipient in recipients:
        chunk.setdefault(recipient_identity(recipient), recipient)
        if len(chunk) == size:
            yield dict(sorted(chunk.items()))
            chunk = {}
    if chunk:
        yield dict(sorted(chunk.items()))


class _InFlight:
    """A blast's published jobs not yet settled; waits while there are ``bound`` of them."""

    def __init__(self, settings: Any, bound: int | None, sleep: Callable[[float], None]) -> None:
        self._settings = settings
        self._bound = bound
        self._sleep = sleep
        self._pending: set[uuid.UUID] = set()
        self._conn: Any = None
        self._logged = False
        self.waited_seconds = 0.0

    def add(self, job_id: uuid.UUID) -> None:
        if self._bound is not None:
            self._pending.add(job_id)

    def wait_for_room(self, published: int) -> None:
        """Return once fewer than ``bound`` published jobs are unsettled.

        The first wait of a blast is logged (``notifications.blast_waiting``); the time
        spent waiting in all is in :attr:`waited_seconds`.
        """
        if self._bound is None or len(self._pending) < self._bound:
            return
        started = time.monotonic()
        try:
            while True:
                self._pending -= self._settled()
                if len(self._pending) < self._bound:
                    return
                if not self._logged:
                    self._logged = True
                    logger.info(
                        "blast waits: %d jobs published, %d not yet settled (bound %d)",
                        published,
                        len(self._pending),
                        self._bound,
                        extra={
                            "event": "notifications.blast_waiting",
                            "published": published,
                            "in_flight": len(self._pending),
                            "bound": self._bound,
                        },
                    )
                self._sleep(WAIT_INTERVAL_SECONDS)
        finally:
            self.waited_seconds += time.monotonic() - started

    def _settled(self) -> set[uuid.UUID]:
        if self._conn is None:
            url = self._settings.database_url
            if not url:
                raise ConfigurationError(
                    "PLATFORM_DATABASE_URL is not set: publish_blast bounds a blast's jobs in "
                    f"flight ({self._bound}) by their idempotency rows; set it, or pass "
                    "max_in_flight=None to publish without back-pressure"
                )
            self._conn = psycopg2.connect(url, application_name="platform-tasks blast publisher")
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute(
                load_queries("blasts")["settled_jobs"],
                {"job_ids": [str(job_id) for job_id in self._pending]},
            )
            return {uuid.UUID(str(row[0])) for row in cur.fetchall()}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def publish_blast(
    port: Any,
    *,
    kind: str,
    tenant_id: str,
    campaign_id: str,
    recipients: Iterable[Any],
    data: Mapping[str, Any] | None = None,
    channel: str = "email",
    chunk_size: int = MAX_CHUNK,
    max_in_flight: int | None = MAX_IN_FLIGHT,
    sleep: Callable[[float], None] = time.sleep,
) -> list[uuid.UUID]:
    """Publish one marketing job per chunk; ``data["recipients"]`` holds the chunk.

    ``data`` is copied into every job (with ``campaign_id`` and ``chunk``, the chunk's
    number in this publish, added). A recipient listed twice is sent to once. Returns
    once every chunk is published; while ``max_in_flight`` of this blast's jobs are
    published and not yet applied or dead-lettered, it waits (``None``: no bound).
    """
    _check_arguments(campaign_id, chunk_size, max_in_flight)
    queue = notification_queue(channel, MARKETING, channels=port.settings.notification_channels)
    base = dict(data or {})
    job_ids: list[uuid.UUID] = []
    in_flight = _InFlight(port.settings, max_in_flight, sleep)
    try:
        for number, chunk in enumerate(_chunks(recipients, chunk_size)):
            in_flight.wait_for_room(len(job_ids))
            payload = {
                "job_id": str(blast_job_id(tenant_id, campaign_id, chunk)),
                "tenant_id": tenant_id,
                "kind": kind,
                "data": {
                    **base,
                    "campaign_id": campaign_id,
                    "chunk": number,
                    "recipients": list(chunk.values()),
                },
            }
            # at once, even from a handler: waiting for room needs the jobs on the broker
            # (their ids are derived, so a retried handler's copies are absorbed)
            job_id = port.publish(queue, payload, tx=None)
            job_ids.append(job_id)
            in_flight.add(job_id)
    finally:
        in_flight.close()
    if in_flight.waited_seconds:
        _log_waited(tenant_id, campaign_id, len(job_ids), in_flight.waited_seconds)
    return job_ids


def _check_arguments(campaign_id: Any, chunk_size: int, max_in_flight: int | None) -> None:
    if not 1 <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be 1 to {MAX_CHUNK}, got {chunk_size}")
    if not isinstance(campaign_id, str) or not campaign_id:
        # the consumer claims recipients only under a string campaign_id
        raise ValueError(f"campaign_id must be a non-empty string, got {campaign_id!r}")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1 or None, got {max_in_flight}")


def _log_waited(tenant_id: str, campaign_id: str, jobs: int, waited: float) -> None:
    logger.info(
        "blast published: %d jobs, %.1f s waited for room",
        jobs,
        waited,
        extra={
            "event": "notifications.blast_published",
            "tenant_id": tenant_id,
            "campaign_id": campaign_id,
            "jobs": jobs,
            "waited_seconds": round(waited, 3),
        },
    )
