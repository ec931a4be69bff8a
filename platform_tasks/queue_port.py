"""``platform_tasks.queue_port``, kept importable; the module lives in ``publishing``."""

from platform_tasks.publishing.queue_port import PublishOptions as PublishOptions
from platform_tasks.publishing.queue_port import QueuePort as QueuePort
