"""The fan-out job: what ``fan_out`` hands to the queue port and its consumer reads.

A plain envelope on the platform's reliable queue (``platform.fanout``), so a fan-out
gets everything any job gets: retries, idempotency, dead letters and replay.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from platform_tasks.envelope import KIND_PATTERN

__all__ = ["FANOUT_KIND", "FANOUT_QUEUE", "FANOUT_TENANT", "FanOutRequest"]

FANOUT_KIND = "platform.fanout"
"""Task name (envelope kind) of the fan-out consumer."""

FANOUT_QUEUE = "platform.fanout"
"""Queue of fan-out jobs; every worker started without ``-Q`` consumes it."""

FANOUT_TENANT = "platform"
"""``tenant_id`` of a fan-out job itself (it belongs to no tenant)."""


class FanOutRequest(BaseModel):
    """``data`` of a fan-out job: which scheduled point, where to, with what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(min_length=1, max_length=255)
    point: datetime
    queue: str = Field(min_length=1, max_length=255)
    kind: str = Field(max_length=255)
    data: dict[str, Any] = Field(default_factory=dict)
    tiers: Literal["due"] | None = None
    on_complete: dict[str, Any] | None = None
    """The callback spec of ``fan_out(..., on_complete=)`` (checked when it was called):
    the fan-out is then a batch whose children are the tenants' jobs."""

    @field_validator("point")
    @classmethod
    def _aware_utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("must be timezone-aware")
        return value.astimezone(UTC)

    @field_validator("kind")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not KIND_PATTERN.match(value):
            raise ValueError("must be at least two dot-separated identifiers")
        return value
