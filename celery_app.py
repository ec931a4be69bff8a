"""Example composition root: ``celery -A celery_app worker|beat|flower``.

The app is built once here with platform defaults (fan-out included), the queue port is
made here, and consumers are declared on ``PlatformTask``. Settings come from the environment
(``PLATFORM_REDIS_URL``, ``PLATFORM_DATABASE_URL``, ...; see the README).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

import example_maintenance
from platform_tasks import PlatformTask, QueuePort, RetryPolicy, create_app
from platform_tasks.notifications import EmailMessage, NotificationTask

logger = logging.getLogger(__name__)

app = create_app(
    "celery_app",
    retry_policies={
        "notif.email.transactional": RetryPolicy(
            max_attempts=8,
            base=timedelta(seconds=5),
            cap=timedelta(minutes=10),
            rationale="password resets and receipts must arrive within minutes",
        ),
    },
)
queue_port = QueuePort(app)
example_maintenance.install(app)


class Greeting(BaseModel):
    """Data of a ``demo.greet`` job."""

    name: str = Field(min_length=1, max_length=100)


@app.task(base=PlatformTask, data_model=Greeting, name="demo.greet")
def greet(envelope: Any, tx: Any) -> None:
    """A consumer: runs inside the transaction that also records the job as processed."""
    tx.execute("SELECT now()")
    logger.info("greeted %s", envelope.data.name, extra={"event": "demo.greeted"})


class Receipt(BaseModel):
    """Data of a ``demo.send_receipt`` job."""

    email: str = Field(min_length=3, max_length=254)
    order_id: str = Field(min_length=1, max_length=64)


@app.task(base=NotificationTask, data_model=Receipt, name="demo.send_receipt",
          channel="email", rail="transactional", provider="resend")  # fmt: skip
def send_receipt(envelope: Any, tx: Any) -> EmailMessage:
    """A send: render the email; the platform rate-limits, sends through Resend, commits."""
    return EmailMessage(
        sender="Demo Shop <shop@example.com>",
        to=envelope.data.email,
        subject=f"Your order {envelope.data.order_id}",
        text=f"Thank you for order {envelope.data.order_id}.",
    )


def publish_samples(count: int) -> list[str]:
    """Sample envelopes for ``platform-tasks dev``."""
    names = ["Ada", "Grace", "Edsger", "Barbara", "Ken"]
    return [
        str(queue_port.publish("default", {
            "tenant_id": "demo-tenant",
            "kind": "demo.greet",
            "data": {"name": names[n % len(names)]},
        }))
        for n in range(count)
    ]  # fmt: skip
