"""The stall watchdog against real PostgreSQL, driven pass by pass with an explicit clock:
one alert per stall whichever watchdog sees it, none before the stall time, a new one
after the batch progressed and stalled again, none for a finished batch, and an alert that
could not be sent is tried again."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.batches.watchdog import BatchWatchdog, Stall
from platform_tasks.settings import PlatformSettings
from tests.support.batch_rows import Child, end_child, insert_batch

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
STALL = timedelta(seconds=600)


class NoWorkers:
    """A locator that finds one child running and nothing delayed."""

    unknown: tuple[str, ...] = ()

    def __init__(self, running: set[str]) -> None:
        self.running = running

    def locate(self, job_ids: list[str]) -> dict[str, str]:
        return {job_id: "running" for job_id in job_ids if job_id in self.running}


def _watchdog(settings: PlatformSettings, locator: NoWorkers, sent: list[tuple[Stall, str]]):
    return BatchWatchdog(
        settings.model_copy(update={"batch_stall_seconds": STALL.total_seconds()}),
        locator=locator,
        alert=lambda stall, message: sent.append((stall, message)),
    )


def test_one_alert_per_stall_naming_where_the_children_are(
    settings: PlatformSettings, database_url: str
) -> None:
    running = Child("acme")
    waiting = [Child("acme"), Child("globex")]
    first_end = T0 + timedelta(minutes=1)
    batch_id = insert_batch(
        database_url,
        [Child("acme", "applied", first_end), Child("acme", "dead_lettered", first_end),
         running, *waiting],
        description="March invoices",
        created_at=T0,
    )  # fmt: skip
    done = insert_batch(  # finished long ago: never a stall
        database_url, [Child("acme", "applied", T0)], created_at=T0 - timedelta(days=1)
    )
    sent: list[tuple[Stall, str]] = []
    locator = NoWorkers({str(running.job_id)})
    one, other = _watchdog(settings, locator, sent), _watchdog(settings, locator, sent)
    try:
        assert one.run_pass(now=first_end + STALL - timedelta(seconds=1)) == []
        [stall] = one.run_pass(now=first_end + STALL + timedelta(seconds=1))
        # the other worker's watchdog, and later passes of both: the same stall, no alert
        assert other.run_pass(now=first_end + STALL + timedelta(seconds=2)) == []
        assert one.run_pass(now=first_end + 3 * STALL) == []
        assert len(sent) == 1
        assert stall.batch_id == batch_id != done
        assert stall.last_progress == first_end
        assert (stall.outstanding, stall.places.waiting, stall.places.running) == (3, 2, 1)
        assert (stall.places.delayed, stall.places.dead) == (0, 0)
        assert sent[0][1] == (
            f"batch {batch_id} (March invoices) has made no progress for 10 min "
            f"(since {first_end.isoformat()}): 3 children outstanding: 2 waiting, "
            f"0 delayed, 1 running, 0 dead; see platform-tasks batches show {batch_id}"
        )

        # a child ends: progress; no alert until it has stalled again for the stall time
        second_end = first_end + 4 * STALL
        end_child(database_url, batch_id, waiting[0].job_id, second_end)
        assert other.run_pass(now=second_end + STALL - timedelta(seconds=1)) == []
        [again] = other.run_pass(now=second_end + STALL + timedelta(seconds=1))
        assert again.last_progress == second_end
        assert (again.outstanding, again.places.waiting) == (2, 1)
        assert one.run_pass(now=second_end + 2 * STALL) == []
        assert len(sent) == 2
    finally:
        one.close()
        other.close()


def test_an_alert_that_could_not_be_sent_is_tried_again(
    settings: PlatformSettings, database_url: str
) -> None:
    insert_batch(database_url, [Child("acme")], created_at=T0)
    attempts: list[str] = []

    def failing_once(stall: Stall, message: str) -> None:
        attempts.append(message)
        if len(attempts) == 1:
            raise ConnectionError("sink down")

    watchdog = BatchWatchdog(
        settings.model_copy(update={"batch_stall_seconds": STALL.total_seconds()}),
        locator=NoWorkers(set()),
        alert=failing_once,
    )
    try:
        with pytest.raises(ConnectionError):
            watchdog.run_pass(now=T0 + 2 * STALL)
        assert len(watchdog.run_pass(now=T0 + 2 * STALL + timedelta(seconds=5))) == 1
        assert watchdog.run_pass(now=T0 + 3 * STALL) == []
        assert len(attempts) == 2
    finally:
        watchdog.close()


def test_the_default_alert_goes_to_the_alert_log_with_the_counts_as_tags(
    settings: PlatformSettings, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    batch_id = insert_batch(database_url, [Child("acme"), Child("acme")], created_at=T0)
    watchdog = BatchWatchdog(
        settings.model_copy(update={"batch_stall_seconds": STALL.total_seconds()}),
        locator=NoWorkers(set()),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="platform_tasks.alerts"):
            [stall] = watchdog.run_pass(now=T0 + 2 * STALL)
    finally:
        watchdog.close()
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "alert.sent"]
    assert record.levelno == logging.WARNING
    assert f"batch {batch_id} has made no progress for 20 min" in record.getMessage()
    assert record.alert_tags == {  # type: ignore[attr-defined]
        "check": "batch_stalled",
        "batch_id": str(batch_id),
        "outstanding": "2",
        "waiting": "2",
        "delayed": "0",
        "running": "0",
        "dead": "0",
    }
    assert record.fingerprint == ["batch-stalled", str(batch_id)]  # type: ignore[attr-defined]
    assert stall.outstanding == 2
