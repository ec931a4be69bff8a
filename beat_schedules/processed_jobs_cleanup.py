"""Purge idempotency rows older than PLATFORM_PROCESSED_JOBS_TTL_DAYS, every night.

Nightly at 03:17 UTC unless ``PLATFORM_PROCESSED_JOBS_PURGE_CRON`` says otherwise (read, like
every setting, from the environment beat and workers share).
"""

from __future__ import annotations

from typing import Any

from platform_tasks.jobs import define_job
from platform_tasks.settings import PlatformSettings


def run(ctx: Any) -> None:
    from platform_tasks.postgres.maintenance import purge_expired_processed_jobs

    deleted = purge_expired_processed_jobs(PlatformSettings.from_env())
    ctx.logger.info(
        "purged %d processed-job rows",
        deleted,
        extra={"event": "maintenance.processed_jobs_purged", "count": deleted},
    )


job = define_job(
    handler=run,
    name="platform.processed_jobs_cleanup",
    cron=PlatformSettings.from_env().processed_jobs_purge_cron,
)
