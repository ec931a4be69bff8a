"""A notification app for end-to-end tests: one transactional and one marketing task.

The rail queues get a two-attempt retry policy on purpose: a throttle that spent an
attempt would dead-letter a job after two throttles, so "0 dead letters" after many
throttles proves no attempt was spent on them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from platform_tasks import RetryPolicy, create_app
from platform_tasks.notifications import EmailMessage, NotificationTask

_POLICY = RetryPolicy(
    max_attempts=2,
    base=timedelta(seconds=1),
    cap=timedelta(seconds=2),
    rationale="tests: throttles must never count as attempts; two attempts would show it",
)

app = create_app(
    "notifications_app",
    retry_policies={"notif.email.transactional": _POLICY, "notif.email.marketing": _POLICY},
)


class Receipt(BaseModel):
    email: str
    n: int = 0


class Digest(BaseModel):
    """``count`` emails to ``{tenant}-d{i}@example.org`` from one job (no ``recipients``:
    the job renders before it takes tokens)."""

    count: int


class Chunk(BaseModel):
    recipients: list[str]
    campaign_id: str
    chunk: int


@app.task(base=NotificationTask, data_model=Receipt, name="notify.receipt")
def receipt(envelope: Any, tx: Any) -> EmailMessage:
    tx.execute("SELECT 1")
    return EmailMessage(
        "Shop <shop@example.com>", envelope.data.email, f"Receipt {envelope.data.n}", text="thanks"
    )


@app.task(base=NotificationTask, data_model=Chunk, name="notify.newsletter", rail="marketing")
def newsletter(envelope: Any, tx: Any) -> list[EmailMessage]:
    return [
        EmailMessage(
            "News <news@example.com>", r, f"News {envelope.data.campaign_id}", html="<p>news</p>"
        )
        for r in envelope.data.recipients
    ]


@app.task(base=NotificationTask, data_model=Digest, name="notify.digest")
def digest(envelope: Any, tx: Any) -> list[EmailMessage]:
    return [
        EmailMessage(
            "Shop <shop@example.com>",
            f"{envelope.tenant_id}-d{i}@example.org",
            f"Digest {i}",
            text="your digest",
        )
        for i in range(envelope.data.count)
    ]
