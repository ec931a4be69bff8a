"""``publish_blast``: a recipient stream as marketing jobs of at most 100 recipients.

The recipients are read chunk by chunk (an iterator of a million rows is never held
whole) and each chunk becomes one job on the channel's marketing rail, whose render
handler returns one email per recipient: one batch request to the provider. Job ids are
derived from ``(tenant, campaign, chunk number)``, so publishing the same blast twice
publishes the same jobs and the consumer's idempotency applies each once.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from platform_tasks.notifications.rails import MARKETING, notification_queue

__all__ = ["MAX_CHUNK", "blast_job_id", "publish_blast"]

MAX_CHUNK = 100
"""Resend's batch limit: one chunk is one batch request."""


def blast_job_id(tenant_id: str, campaign_id: str, chunk: int) -> uuid.UUID:
    """A UUID of version 7 derived from ``(tenant, campaign, chunk)``: the same every time."""
    digest = bytearray(
        hashlib.sha256(f"blast\0{tenant_id}\0{campaign_id}\0{chunk}".encode()).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x70  # version 7
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 9562 variant
    return uuid.UUID(bytes=bytes(digest))


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
) -> list[uuid.UUID]:
    """Publish one marketing job per chunk; ``data["recipients"]`` holds the chunk.

    ``data`` is copied into every job (with ``campaign_id`` and ``chunk`` added).
    """
    if not 1 <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be 1 to {MAX_CHUNK}, got {chunk_size}")
    if not campaign_id:
        raise ValueError("campaign_id must be a non-empty string")
    queue = notification_queue(channel, MARKETING, channels=port.settings.notification_channels)
    base = dict(data or {})
    stream = iter(recipients)
    job_ids: list[uuid.UUID] = []
    number = 0
    while chunk := list(islice(stream, chunk_size)):
        payload = {
            "job_id": str(blast_job_id(tenant_id, campaign_id, number)),
            "tenant_id": tenant_id,
            "kind": kind,
            "data": {**base, "campaign_id": campaign_id, "chunk": number, "recipients": chunk},
        }
        job_ids.append(port.publish(queue, payload))
        number += 1
    return job_ids
