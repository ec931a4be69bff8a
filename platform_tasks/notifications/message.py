"""``EmailMessage``: one email as a render handler returns it, validated before any send.

The model is the provider-neutral shape of an email; :meth:`EmailMessage.to_resend`
gives Resend's JSON. Attachments and scheduled sends exist for single sends only: Resend's
batch endpoint drops them silently, so a batch that carries them is refused before it
is sent (:func:`refuse_batch_only_fields`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from platform_tasks.errors import PermanentError

__all__ = ["Attachment", "EmailMessage", "refuse_batch_only_fields"]

_ADDRESS = re.compile(r"[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+")
_NAMED_ADDRESS = re.compile(r"[^<>]*<(?P<address>[^<>]+)>")
_TAG = re.compile(r"[A-Za-z0-9_-]{1,256}")


def _check_address(value: str) -> str:
    match = _NAMED_ADDRESS.fullmatch(value.strip())
    address = match["address"] if match else value.strip()
    if not _ADDRESS.fullmatch(address):
        raise ValueError(f"{value!r} is not an email address")
    return value.strip()


class Attachment(BaseModel):
    """A file sent with a single email (``content`` is base64)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    filename: str = Field(min_length=1, max_length=255)
    content: str = Field(min_length=1)
    content_type: str | None = None


class EmailMessage(BaseModel):
    """One email: ``sender``, 1 to 50 ``to`` addresses, a subject and an HTML or text body."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sender: str
    to: list[str] = Field(min_length=1, max_length=50)
    subject: str = Field(min_length=1, max_length=998)
    html: str | None = None
    text: str | None = None
    reply_to: list[str] | None = None
    headers: dict[str, str] | None = None
    tags: dict[str, str] | None = None
    attachments: list[Attachment] | None = None
    scheduled_at: datetime | None = None

    def __init__(
        self, sender: str | None = None, to: Any = None, subject: str | None = None, **fields: Any
    ) -> None:
        super().__init__(sender=sender, to=to, subject=subject, **fields)

    @field_validator("to", "reply_to", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("sender")
    @classmethod
    def _sender(cls, value: str) -> str:
        return _check_address(value)

    @field_validator("to", "reply_to")
    @classmethod
    def _addresses(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_check_address(v) for v in value]

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, tag in (value or {}).items():
            if not _TAG.fullmatch(name) or not _TAG.fullmatch(tag):
                raise ValueError(
                    f"tag {name}={tag}: names and values are ASCII letters, "
                    "digits, _ and - (at most 256)"
                )
        return value

    def model_post_init(self, context: Any, /) -> None:
        if not self.html and not self.text:
            raise ValueError("an email needs html or text")

    def to_resend(self) -> dict[str, Any]:
        """Resend's JSON for this email (``from``, ``to``, ``subject``...)."""
        body: dict[str, Any] = {"from": self.sender, "to": list(self.to), "subject": self.subject}
        if self.html is not None:
            body["html"] = self.html
        if self.text is not None:
            body["text"] = self.text
        if self.reply_to:
            body["reply_to"] = list(self.reply_to)
        if self.headers:
            body["headers"] = dict(self.headers)
        if self.tags:
            body["tags"] = [{"name": k, "value": v} for k, v in sorted(self.tags.items())]
        if self.attachments:
            body["attachments"] = [a.model_dump(exclude_none=True) for a in self.attachments]
        if self.scheduled_at is not None:
            body["scheduled_at"] = self.scheduled_at.isoformat()
        return body


def refuse_batch_only_fields(messages: Sequence[EmailMessage]) -> None:
    """Raise :class:`PermanentError` when a batch carries what the batch endpoint drops."""
    for index, message in enumerate(messages):
        if message.attachments:
            raise PermanentError(
                f"email {index} of a batch has attachments: the batch endpoint drops them; "
                "send it on its own (transactional rail, one email per job)"
            )
        if message.scheduled_at is not None:
            raise PermanentError(
                f"email {index} of a batch has scheduled_at: the batch endpoint drops it; "
                "schedule the job with queue_port.schedule() instead"
            )
