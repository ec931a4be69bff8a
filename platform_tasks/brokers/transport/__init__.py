"""The platform's kombu transport for Redis brokers.

A subclass of kombu's Redis transport (not a fork) that takes a message and records it
as unacked in one atomic script, so a worker killed at any moment loses nothing, and that
spends less CPU per message (one cached client, scripts instead of MULTI/EXEC). See
``docs/transport.md``.
"""

from __future__ import annotations

from platform_tasks.brokers.selection import (
    TRANSPORT_PATH,
    sweep_interval,
    transport_conf,
)
from platform_tasks.brokers.transport.transport import Transport

__all__ = ["TRANSPORT_PATH", "Transport", "sweep_interval", "transport_conf"]
