"""Milliseconds since the Unix epoch: the unit every Redis script and delay entry compares.

One conversion for the whole package (it was written by hand in six modules), exact in
integer arithmetic rather than through a float timestamp.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["EPOCH", "epoch_ms", "from_epoch_ms"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def epoch_ms(instant: datetime) -> int:
    """Whole milliseconds from the epoch to an aware ``instant`` (rounded down)."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant must be timezone-aware, got naive {instant.isoformat()}")
    return (instant - EPOCH) // _ONE_MS


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC instant ``ms`` milliseconds after the epoch."""
    return EPOCH + timedelta(milliseconds=ms)
