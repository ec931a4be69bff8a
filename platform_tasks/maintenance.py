"""``platform_tasks.maintenance``, named in users' scheduled jobs; it lives in ``postgres``."""

from platform_tasks.postgres.maintenance import (
    purge_expired_processed_jobs as purge_expired_processed_jobs,
)
from platform_tasks.postgres.maintenance import (
    report_stale_dead_letters as report_stale_dead_letters,
)
