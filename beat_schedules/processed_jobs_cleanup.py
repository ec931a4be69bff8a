"""Purge idempotency rows older than PLATFORM_PROCESSED_JOBS_TTL_DAYS, every night."""

from __future__ import annotations

from typing import Any

from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    from platform_tasks.maintenance import purge_expired_processed_jobs
    from platform_tasks.settings import PlatformSettings

    deleted = purge_expired_processed_jobs(PlatformSettings.from_env())
    ctx.logger.info(
        "purged %d processed-job rows",
        deleted,
        extra={"event": "maintenance.processed_jobs_purged", "count": deleted},
    )


job = define_job(handler=run, name="platform.processed_jobs_cleanup", cron="17 3 * * *")
