"""``platform_tasks.beat:LeaseScheduler``, the scheduler string users configure.

The scheduler lives in :mod:`platform_tasks.jobs.beat`.
"""

from platform_tasks.jobs.beat import LeaseScheduler as LeaseScheduler
