"""``platform_tasks.beat:LeaseScheduler``, the scheduler string users configure.

The scheduler lives in :mod:`platform_tasks.jobs.beat`.

A one-line package rather than a module file, so that version control follows the moved
module to its new home (a file left at the old path hides the rename from merges).
"""

from platform_tasks.jobs.beat import LeaseScheduler as LeaseScheduler
