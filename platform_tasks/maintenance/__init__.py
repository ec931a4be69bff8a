"""``platform_tasks.maintenance``, named in users' scheduled jobs; it lives in ``postgres``.

A one-line package rather than a module file, so that version control follows the moved
module to its new home (a file left at the old path hides the rename from merges).
"""

from platform_tasks.postgres.maintenance import (
    purge_expired_processed_jobs as purge_expired_processed_jobs,
)
from platform_tasks.postgres.maintenance import (
    report_stale_dead_letters as report_stale_dead_letters,
)
