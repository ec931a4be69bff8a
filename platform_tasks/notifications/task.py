"""``NotificationTask``: a PlatformTask whose handler renders and whose platform sends.

::

    @app.task(base=NotificationTask, data_model=Receipt, name="shop.send_receipt",
              channel="email", rail="transactional", provider="resend")
    def send_receipt(envelope, tx) -> EmailMessage: ...

One attempt (:meth:`NotificationTask.execute`, inside the transaction that holds the
idempotency row): render; take the provider request and tenant message tokens in one
script; send; return. A job that says how many messages it will render
(:meth:`NotificationTask.planned_messages`: a blast's ``recipients``) takes its first
request's tokens *before* rendering, so a refused blast does not render 100 emails first.
The idempotency row then commits with the handler's work, so a job
whose send succeeded is never sent again by this platform, even after the provider has
forgotten its idempotency key (24 h). A job of several requests refused between two of
them resumes at the first one not answered (its send record in Redis, see
:mod:`~platform_tasks.notifications.send_records`). Anything that says "not now" (no token, a 429, a
quota pause) raises :class:`~platform_tasks.errors.Throttled`: the transaction rolls back
and the job runs again at the time the buckets say, without spending an attempt.

The task's queue defaults to ``notification_queue(channel, rail)``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from platform_tasks.consumer.task import PlatformTask
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import error_type_name
from platform_tasks.errors import ConfigurationError, PermanentError
from platform_tasks.notifications.blast_recipients import claim_recipients
from platform_tasks.notifications.dispatch import Rejection
from platform_tasks.notifications.message import EmailMessage
from platform_tasks.notifications.provider import ProviderRejected
from platform_tasks.notifications.rails import RAILS, TRANSACTIONAL, notification_queue
from platform_tasks.notifications.setup import dispatcher_for

__all__ = ["NOTIFICATION_OPTIONS", "REJECTED_RECIPIENTS", "NotificationTask"]

logger = logging.getLogger(__name__)

REJECTED_RECIPIENTS = "rejected_recipients"
"""The dead-letter ``reason`` of the emails a provider refused one by one (a bad address
in a batch) while it sent the rest of the job."""

NOTIFICATION_OPTIONS = frozenset({"channel", "rail", "provider"})
"""Task options NotificationTask owns, besides PlatformTask's (``platform_options``)."""


class NotificationTask(PlatformTask):
    """A send: ``render(envelope, tx)`` returns an EmailMessage (or a list); the platform sends."""

    channel: ClassVar[str] = "email"
    rail: ClassVar[str] = TRANSACTIONAL
    provider: ClassVar[str] = "resend"

    #: PlatformTask's declaration check accepts these too (and refuses any other unknown one)
    platform_options: ClassVar[frozenset[str]] = (
        PlatformTask.platform_options | NOTIFICATION_OPTIONS
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_notification_options(cls)

    def planned_messages(self, envelope: Any) -> int | None:
        """How many messages this job will render, when known before rendering.

        The default reads ``data.recipients`` (what :func:`publish_blast` puts in every
        chunk): its length. ``None`` (no such field) renders first and takes tokens after.
        A task whose render handler returns a different number of messages than its
        recipients should return ``None`` here.
        """
        data = envelope.data
        recipients = (
            data.get("recipients")
            if isinstance(data, Mapping)
            else getattr(data, "recipients", None)
        )
        if isinstance(recipients, Sequence) and not isinstance(recipients, str | bytes):
            return len(recipients)
        return None

    def execute(self, envelope: Any, tx: Any) -> Any:
        """Render, take tokens, send; Throttled when the limits or the provider say later.

        A blast chunk first claims its recipients for its campaign in ``tx``
        (:func:`~platform_tasks.notifications.blast_recipients.claim_recipients`) and
        renders only for those it claimed: a campaign published again reaches each
        recipient at most once.

        With :meth:`planned_messages` known, the first request's tokens are taken first:
        a refusal then costs one script call instead of a render. If the render then
        fails, those tokens are spent without a send (one request of the provider's rate).
        """
        claimed = claim_recipients(envelope, tx)
        if claimed is None:
            return []  # a blast chunk whose every recipient this campaign already reached
        envelope = claimed
        dispatcher = dispatcher_for(self.app)
        planned = self.planned_messages(envelope)
        progress = dispatcher.progress(envelope.job_id)
        first_taken = False
        if planned:
            first_taken = dispatcher.take_first(
                provider=self.provider,
                rail=self.rail,
                tenant_id=envelope.tenant_id,
                planned=planned,
                progress=progress,
            )
        rendered = self.run(envelope, tx)
        messages = _as_messages(rendered, self.name)
        if not messages and progress.plan is None:
            return []
        outcome = dispatcher.send(
            provider=self.provider,
            rail=self.rail,
            tenant_id=envelope.tenant_id,
            job_id=envelope.job_id,
            messages=messages,
            first_taken=first_taken,
            progress=progress,
        )
        if outcome.rejected:
            self._dead_letter_rejected(envelope, tx, outcome.rejected, len(messages))
        return outcome.ids

    def _dead_letter_rejected(
        self, envelope: Any, tx: Any, rejected: Sequence[Rejection], total: int
    ) -> None:
        """One dead letter naming the emails the provider refused; the job itself applies.

        Written in the job's transaction, so it commits with the job: exactly one row per
        job however often a throttle ran it again. One row per job rather than per email:
        a chunk of 100 with 30 bad addresses is one thing for an operator to read and
        discard, and one alert. Replaying the row sends nothing (the job was applied):
        the addresses are fixed where the recipients come from, and sent in a new job.
        """
        lines = "\n".join(r.describe() for r in rejected)
        record = DeadLetter(
            job_id=envelope.job_id,
            queue=self.queue,
            kind=envelope.kind,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            payload=envelope.to_message(),
            attempts=1,
            last_error=(
                f"{self.provider} refused {len(rejected)} of the {total} emails of this job "
                f"and sent the others; replaying this row sends nothing:\n{lines}"
            ),
            error_type=error_type_name(ProviderRejected("", provider=self.provider)),
            reason=REJECTED_RECIPIENTS,
        )
        row = record.write(tx)
        logger.error(
            "job %s: %s refused %d of %d emails (dead letter %d)",
            envelope.job_id,
            self.provider,
            len(rejected),
            total,
            row,
            extra={
                "event": "notifications.recipients_rejected",
                "job_id": str(envelope.job_id),
                "provider": self.provider,
                "rejected": len(rejected),
                "dead_letter_id": row,
            },
        )
        record.alert(row)


def _check_notification_options(cls: type[NotificationTask]) -> None:
    namespace = vars(cls)
    name = namespace.get("name") or cls.__name__
    if cls.rail not in RAILS:
        raise ConfigurationError(
            f"task {name!r}: rail {cls.rail!r} is not one of {', '.join(RAILS)}"
        )
    app = namespace.get("app")
    settings = getattr(app, "platform_settings", None)
    if settings is None:
        return  # the base class itself, or a task on an app without platform settings
    try:
        queue = notification_queue(cls.channel, cls.rail, channels=settings.notification_channels)
    except ValueError as exc:
        raise ConfigurationError(f"task {name!r}: {exc}") from None
    if cls.provider not in settings.provider_rate_limits:
        raise ConfigurationError(
            f"task {name!r}: provider {cls.provider!r} has no limit in "
            f"PLATFORM_PROVIDER_RATE_LIMITS (configured: "
            f"{', '.join(sorted(settings.provider_rate_limits)) or 'none'})"
        )
    if "queue" not in namespace:
        cls.queue = queue


def _as_messages(rendered: Any, task_name: str) -> list[Any]:
    if rendered is None:
        return []
    if isinstance(rendered, EmailMessage) or not isinstance(rendered, Sequence):
        return [rendered]
    if isinstance(rendered, str | bytes):
        raise PermanentError(
            f"task {task_name!r}: the render handler returned {type(rendered).__name__}, "
            "not an EmailMessage or a list of them"
        )
    return list(rendered)
