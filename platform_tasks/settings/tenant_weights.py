"""PLATFORM_TENANT_WEIGHTS: ``tenant=weight`` pairs, as the operator writes them.

The fair transport gives a tenant of weight N that many jobs per turn; the value is parsed
here, with the other settings, so a bad entry stops start-up naming the setting.
"""

from __future__ import annotations

import re

from platform_tasks.keys import TENANT_PATTERN

_TENANT = re.compile(TENANT_PATTERN)

MAX_WEIGHT = 1000
MAX_WEIGHTED_TENANTS = 1000
"""The weights travel with every fetch (no shared state to go stale), so they are kept
to a size that costs microseconds."""


def parse_tenant_weights(text: str) -> dict[str, int]:
    """``acme=4,globex=2`` as ``{"acme": 4, "globex": 2}``; ``ValueError`` naming the entry."""
    weights: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        tenant, sep, number = part.partition("=")
        tenant = tenant.strip()
        if not sep or not _TENANT.fullmatch(tenant):
            raise ValueError(f"{part!r} is not tenant=weight (tenant ids match {TENANT_PATTERN})")
        try:
            weight = int(number.strip())
        except ValueError:
            raise ValueError(f"{part!r}: weight must be a whole number") from None
        if not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"{part!r}: weight must be between 1 and {MAX_WEIGHT}")
        if tenant in weights:
            raise ValueError(f"tenant {tenant!r} is named twice")
        weights[tenant] = weight
    if len(weights) > MAX_WEIGHTED_TENANTS:
        raise ValueError(f"at most {MAX_WEIGHTED_TENANTS} tenants can have a weight")
    return weights
