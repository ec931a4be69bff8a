"""Who a blast recipient is, and the claim that sends a campaign to each one at most once.

A blast's unit of "sent" is the recipient, not the chunk: a campaign published again in
another order, with recipients added or removed, is chunked differently, so chunk jobs
alone cannot tell who was already reached. Each chunk job therefore claims its
recipients in ``core.blast_recipients`` (one row per tenant, campaign and recipient) in
the same transaction as its idempotency row and its send, and renders only for the
recipients it claimed. A claim commits exactly when the send's job commits; a throttled,
failed or dead-lettered send rolls its claims back, so the recipient is free for a later
delivery or a later publish.

Identity (:func:`recipient_identity`): a string recipient is its address with Unicode
NFC normalisation, surrounding whitespace stripped and case folded (``Ann@Example.org``
and ``ann@example.org`` are one mailbox for a campaign: sending twice is the worse
mistake); any other value is its JSON with sorted keys. The database keeps 16 bytes of
SHA-256 of that identity (:func:`recipient_key`), never the address.

A job is a blast chunk when its ``data`` carries ``campaign_id`` and ``recipients``
(what :func:`~platform_tasks.notifications.blasts.publish_blast` writes): a pydantic
data model of a blast task must declare both fields, since pydantic drops undeclared ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from platform_tasks.postgres.queries import load_queries

__all__ = ["claim_recipients", "recipient_identity", "recipient_key"]

logger = logging.getLogger(__name__)


def recipient_identity(recipient: Any) -> str:
    """The normalised identity of one recipient (see the module docstring)."""
    if isinstance(recipient, str):
        return unicodedata.normalize("NFC", recipient).strip().casefold()
    return json.dumps(recipient, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def recipient_key(recipient: Any) -> bytes:
    """16 bytes of SHA-256 of :func:`recipient_identity`: what a claim row stores."""
    return hashlib.sha256(recipient_identity(recipient).encode()).digest()[:16]


def _field(data: Any, name: str) -> Any:
    if isinstance(data, Mapping):
        return data.get(name)
    return getattr(data, name, None)


def _blast_fields(data: Any) -> tuple[str, Sequence[Any]] | None:
    campaign_id = _field(data, "campaign_id")
    recipients = _field(data, "recipients")
    if not isinstance(campaign_id, str) or not campaign_id:
        return None
    if not isinstance(recipients, Sequence) or isinstance(recipients, str | bytes):
        return None
    return campaign_id, recipients


def _with_recipients(data: Any, recipients: list[Any]) -> Any:
    if isinstance(data, BaseModel):
        return data.model_copy(update={"recipients": recipients})
    return {**data, "recipients": recipients}


def claim_recipients(envelope: Any, tx: Any) -> Any | None:
    """Claim a blast chunk's recipients in ``tx``; the envelope to render, or ``None``.

    Not a blast chunk (no ``campaign_id`` or ``recipients``): the envelope unchanged.
    Otherwise the returned envelope's ``data.recipients`` holds only the recipients this
    job claimed (in their order, each once), and ``None`` means every one of them was
    already reached by this campaign: nothing to render or send.
    """
    fields = _blast_fields(envelope.data)
    if fields is None:
        return envelope
    campaign_id, recipients = fields
    keyed: dict[bytes, Any] = {}
    for recipient in recipients:
        keyed.setdefault(recipient_key(recipient), recipient)
    if not keyed:
        return envelope
    tx.execute(
        load_queries("blasts")["claim_recipients"],
        {
            "tenant_id": envelope.tenant_id,
            "campaign_id": campaign_id,
            "job_id": str(envelope.job_id),
            "keys": sorted(keyed),
        },
    )
    claimed = {bytes(row[0]) for row in tx.fetchall()}
    kept = [recipient for key, recipient in keyed.items() if key in claimed]
    skipped = len(recipients) - len(kept)
    if skipped:
        logger.info(
            "blast %s: %d of %d recipients already reached by this campaign (or listed twice)",
            envelope.job_id,
            skipped,
            len(recipients),
            extra={
                "event": "notifications.blast_recipients_skipped",
                "job_id": str(envelope.job_id),
                "tenant_id": envelope.tenant_id,
                "campaign_id": campaign_id,
                "skipped": skipped,
                "recipients": len(recipients),
            },
        )
    if not kept:
        return None
    if len(kept) == len(recipients):
        return envelope
    return envelope.model_copy(update={"data": _with_recipients(envelope.data, kept)})
