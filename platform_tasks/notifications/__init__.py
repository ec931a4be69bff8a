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

