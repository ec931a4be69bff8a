"""Notification rails: per-channel transactional and marketing queues, rate-limited sends.

- :func:`notification_queue` names the two queues of a channel (``notif.{channel}.{rail}``);
- :class:`NotificationTask` is a :class:`~platform_tasks.PlatformTask` whose handler renders
  what to send; the platform takes the rate-limit tokens (provider requests and tenant
  messages, both or nothing), sends through the provider and commits the idempotency row
  with the handler's work;
- :class:`EmailMessage` is one email; :func:`publish_blast` chunks a recipient stream into
  marketing jobs of at most 100 recipients;
- marketing consumers yield while the transactional queue of their channel is deep.

Names are imported on first use, so the settings module can read the rate-limit syntax
from here without importing Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platform_tasks.lazy import lazy_exports

if TYPE_CHECKING:
    from platform_tasks.notifications.blasts import publish_blast
    from platform_tasks.notifications.message import EmailMessage
    from platform_tasks.notifications.provider import Provider, SendResult
    from platform_tasks.notifications.rails import RAILS, notification_queue
    from platform_tasks.notifications.setup import install, register_provider
    from platform_tasks.notifications.task import NotificationTask
    from platform_tasks.settings.rate_limits import RateLimit

__all__ = [
    "RAILS",
    "EmailMessage",
    "NotificationTask",
    "Provider",
    "RateLimit",
    "SendResult",
    "install",
    "notification_queue",
    "publish_blast",
    "register_provider",
]

_HOMES: dict[str, str] = {
    "RAILS": "platform_tasks.notifications.rails",
    "EmailMessage": "platform_tasks.notifications.message",
    "NotificationTask": "platform_tasks.notifications.task",
    "Provider": "platform_tasks.notifications.provider",
    "RateLimit": "platform_tasks.settings.rate_limits",
    "SendResult": "platform_tasks.notifications.provider",
    "install": "platform_tasks.notifications.setup",
    "notification_queue": "platform_tasks.notifications.rails",
    "publish_blast": "platform_tasks.notifications.blasts",
    "register_provider": "platform_tasks.notifications.setup",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
