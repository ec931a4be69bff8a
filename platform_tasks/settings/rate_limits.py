"""Rate-limit settings: ``name=N/s|min|h`` pairs, as the operator writes them.

``PLATFORM_PROVIDER_RATE_LIMITS=resend=5/s`` limits the requests the whole deployment
sends to Resend; ``PLATFORM_TENANT_RATE_LIMITS=resend=600/min`` limits the messages one
tenant sends through Resend. The limit is always a setting, never a constant: providers
change their limits per account.

This module imports nothing heavy: the settings module parses with it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["PERIODS", "RateLimit", "parse_rate_limits"]

PERIODS = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
"""Accepted period suffixes and their length in seconds."""

_PAIR = re.compile(r"(?P<name>[a-z][a-z0-9_-]{0,63})=(?P<count>\d+(?:\.\d+)?)/(?P<period>[a-z]+)")

PROVIDER_BURST_SECONDS = 0.05
"""How much of its rate a provider bucket holds (``48/s``: 2 tokens, ``20/s``: 1). A provider
that counts requests per second sees at most capacity + rate in any second; with a burst
of 5 % that stays within the limit when the setting is a few percent below it."""

LEARNED_WINDOW_SECONDS = 1.0
"""The window of a provider's ``ratelimit-limit`` header (Resend counts per second)."""


@dataclass(frozen=True)
class RateLimit:
    """``count`` units per ``period_seconds``; a token bucket refilling at that rate."""

    count: float
    period_seconds: int

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise ValueError(f"a rate limit must be positive, got {self.count}")
        if self.period_seconds <= 0:
            raise ValueError(f"a rate period must be positive, got {self.period_seconds}")

    @property
    def per_second(self) -> float:
        return self.count / self.period_seconds

    @property
    def capacity(self) -> float:
        """Tokens a full tenant bucket holds: one period's worth (``10/min``: 10 at once,
        then one every 6 s)."""
        return max(1.0, self.count)

    @property
    def provider_capacity(self) -> float:
        """Tokens a full provider bucket holds: :data:`PROVIDER_BURST_SECONDS` of the rate,
        at least one. Small on purpose: a provider counting requests per second must never
        see much more than its limit in any second, even right after an idle spell."""
        return max(1.0, math.floor(self.per_second * PROVIDER_BURST_SECONDS))

    def __str__(self) -> str:
        unit = {1: "s", 60: "min", 3600: "h"}.get(self.period_seconds)
        count = int(self.count) if float(self.count).is_integer() else self.count
        if unit is None:
            return f"{count}/{self.period_seconds}s"
        return f"{count}/{unit}"


def parse_rate_limits(text: str) -> dict[str, RateLimit]:
    """Parse ``"resend=5/s, twilio=100/min"``; raise ``ValueError`` naming the bad pair."""
    limits: dict[str, RateLimit] = {}
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        match = _PAIR.fullmatch(part.replace(" ", ""))
        if match is None or match["period"] not in PERIODS:
            raise ValueError(f"{part!r} is not name=N/s, name=N/min or name=N/h (e.g. resend=5/s)")
        name = match["name"]
        if name in limits:
            raise ValueError(f"{name!r} is given twice")
        count = float(match["count"])
        if count <= 0:
            raise ValueError(f"{part!r}: the limit must be positive")
        limits[name] = RateLimit(count, PERIODS[match["period"]])
    return limits
