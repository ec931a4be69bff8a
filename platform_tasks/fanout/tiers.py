"""Freshness tiers: which tenants a ``tiers="due"`` fan-out selects at a point.

A tier is due at the UTC hours that are multiples of its period (``1h`` every hour,
``3h`` at 00/03/06/…, ``6h`` at 00/06/12/18, ``12h`` at 00/12, ``nightly`` at 00), so
one hourly job covers every tier and a tenant is selected once per due hour. Hours are
UTC on purpose: a zone's DST change would otherwise shift, drop or double a tier's runs.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["TIERS", "TIER_PERIOD_HOURS", "due_tiers", "is_due"]

TIER_PERIOD_HOURS: dict[str, int] = {"1h": 1, "3h": 3, "6h": 6, "12h": 12, "nightly": 24}
"""Every tier and its period in hours; ``core.tenants`` accepts exactly these names."""

TIERS: tuple[str, ...] = tuple(TIER_PERIOD_HOURS)


def is_due(tier: str, point: datetime) -> bool:
    """True when ``tier`` is due in the UTC hour that contains ``point``."""
    try:
        period = TIER_PERIOD_HOURS[tier]
    except KeyError:
        raise ValueError(f"unknown freshness tier {tier!r} (known: {', '.join(TIERS)})") from None
    if point.tzinfo is None or point.utcoffset() is None:
        raise ValueError(f"point must be timezone-aware, got naive {point.isoformat()}")
    return point.astimezone(UTC).hour % period == 0


def due_tiers(point: datetime) -> tuple[str, ...]:
    """The tiers due in the UTC hour of ``point`` (``1h`` always is)."""
    return tuple(tier for tier in TIERS if is_due(tier, point))
