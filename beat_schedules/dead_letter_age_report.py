"""Alert when dead letters wait in pending_review longer than the alert age, hourly.

Hourly at :05 UTC unless ``PLATFORM_DEAD_LETTER_REPORT_CRON`` says otherwise (read, like
every setting, from the environment beat and workers share).
"""

from __future__ import annotations

from typing import Any

from platform_tasks.jobs import define_job
from platform_tasks.settings import PlatformSettings


def run(ctx: Any) -> None:
    from platform_tasks.postgres.maintenance import report_stale_dead_letters

    stale = report_stale_dead_letters(PlatformSettings.from_env())
    ctx.logger.info(
        "%d stale dead letter(s)",
        stale,
        extra={"event": "maintenance.stale_dead_letters", "count": stale},
    )


job = define_job(
    handler=run,
    name="platform.dead_letter_age_report",
    cron=PlatformSettings.from_env().dead_letter_report_cron,
)
