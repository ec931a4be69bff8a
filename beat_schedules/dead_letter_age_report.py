"""Alert when dead letters wait in pending_review longer than the alert age, hourly."""

from __future__ import annotations

from typing import Any

from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    from platform_tasks.maintenance import report_stale_dead_letters
    from platform_tasks.settings import PlatformSettings

    stale = report_stale_dead_letters(PlatformSettings.from_env())
    ctx.logger.info(
        "%d stale dead letter(s)",
        stale,
        extra={"event": "maintenance.stale_dead_letters", "count": stale},
    )


job = define_job(handler=run, name="platform.dead_letter_age_report", cron="5 * * * *")
