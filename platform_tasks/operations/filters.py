"""What an operation acts on: the filters of a bulk dead-letter action and of a job cancel.

A filter is stored as JSON in ``core.operations.filter``; two runs with the same filter
are the same operation (a rerun after a crash continues the unfinished one), so the JSON
form is canonical: every key present, times in UTC ISO 8601.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from platform_tasks.consumer.cancels import JobFilter, filter_text

__all__ = ["JobFilter", "OperationFilter"]


def _time_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _time_value(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"filter field {name!r}: {value!r} is not an ISO 8601 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class OperationFilter:
    """Which pending dead letters a bulk replay or discard means; ``None`` matches any.

    ``since`` is inclusive and ``until`` exclusive, both on ``created_at`` (when the job
    became a dead letter).
    """

    queue: str | None = None
    kind: str | None = None
    tenant_id: str | None = None
    error_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("queue", "kind", "tenant_id", "error_type"):
            filter_text(getattr(self, name), name)
        if self.since is not None and self.since.tzinfo is None:
            object.__setattr__(self, "since", self.since.replace(tzinfo=UTC))
        if self.until is not None and self.until.tzinfo is None:
            object.__setattr__(self, "until", self.until.replace(tzinfo=UTC))
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError(
                f"filter field 'until' ({self.until.isoformat()}) must be after "
                f"'since' ({self.since.isoformat()})"
            )

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, item.name) is None for item in fields(self))

    def params(self) -> dict[str, Any]:
        """The SQL parameters of the dead-letter queries (``NULL`` means any)."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def to_json(self) -> dict[str, str | None]:
        """The canonical JSON form stored in ``core.operations.filter``."""
        return {
            "queue": self.queue,
            "kind": self.kind,
            "tenant_id": self.tenant_id,
            "error_type": self.error_type,
            "since": _time_text(self.since),
            "until": _time_text(self.until),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OperationFilter:
        """Read the JSON form back; an unknown key is refused, naming it."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown filter field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(
            queue=filter_text(data.get("queue"), "queue"),
            kind=filter_text(data.get("kind"), "kind"),
            tenant_id=filter_text(data.get("tenant_id"), "tenant_id"),
            error_type=filter_text(data.get("error_type"), "error_type"),
            since=_time_value(data.get("since"), "since"),
            until=_time_value(data.get("until"), "until"),
        )

    def describe(self) -> str:
        """``queue=q kind=k`` for logs and confirmations; ``every pending row`` when empty."""
        parts = [f"{key}={value}" for key, value in self.to_json().items() if value is not None]
        return " ".join(parts) if parts else "every pending row"
