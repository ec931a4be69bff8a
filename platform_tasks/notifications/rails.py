"""The two rails of every notification channel: ``notif.{channel}.transactional`` and
``notif.{channel}.marketing``.

Transactional mail (password resets, receipts) and marketing mail (blasts) of one channel
never share a queue, so a blast can never stand in front of a password reset; marketing
consumers also yield while the transactional queue is deep
(:mod:`platform_tasks.notifications.marketing_yield`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["MARKETING", "RAILS", "TRANSACTIONAL", "notification_queue", "rail_queues"]

TRANSACTIONAL: Final = "transactional"
MARKETING: Final = "marketing"
RAILS: Final = (TRANSACTIONAL, MARKETING)
QUEUE_PREFIX: Final = "notif"


def _configured_channels() -> list[str]:
    from platform_tasks.settings import PlatformSettings

    return list(PlatformSettings.from_env().notification_channels)


def notification_queue(channel: str, rail: str, *, channels: Iterable[str] | None = None) -> str:
    """``"notif.{channel}.{rail}"``; an unconfigured channel or unknown rail raises ValueError.

    ``channels`` are the configured channels (default: ``PLATFORM_NOTIFICATION_CHANNELS``).
    """
    if rail not in RAILS:
        raise ValueError(f"unknown rail {rail!r}: a rail is 'transactional' or 'marketing'")
    known = list(channels) if channels is not None else _configured_channels()
    if channel not in known:
        raise ValueError(
            f"channel {channel!r} is not configured (PLATFORM_NOTIFICATION_CHANNELS: "
            f"{', '.join(known)})"
        )
    return f"{QUEUE_PREFIX}.{channel}.{rail}"


def rail_queues(channels: Iterable[str]) -> list[str]:
    """Every rail queue of ``channels``, transactional before marketing for each channel."""
    names = list(channels)
    return [notification_queue(c, rail, channels=names) for c in names for rail in RAILS]


def queue_source(app: PlatformCelery) -> list[str]:
    """The worker-queues source: a worker without ``-Q`` consumes every configured rail."""
    return rail_queues(app.platform_settings.notification_channels)
