"""``platform_tasks.queue_port``, kept importable; the module lives in ``publishing``.

A one-line package rather than a module file, so that version control follows the moved
module to its new home (a file left at the old path hides the rename from merges).
"""

from platform_tasks.publishing.queue_port import PublishOptions as PublishOptions
from platform_tasks.publishing.queue_port import QueuePort as QueuePort
