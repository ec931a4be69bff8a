"""What the stall alert and ``batches show`` say about where children are: pure text."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from platform_tasks.batches.status import Places
from platform_tasks.batches.watchdog import Stall, stall_message

BATCH = uuid.UUID("01a24f9a-5ff2-7bed-9573-db6446b0f0f6")
SINCE = datetime(2026, 3, 2, 9, 5, tzinfo=UTC)


def test_places_name_what_could_not_be_looked_in_and_what_was_not_looked_up() -> None:
    assert Places(3, 1, 2, 0).describe() == "3 waiting, 1 delayed, 2 running, 0 dead"
    places = Places(5, 0, 0, 1, unknown=("workers (none answered)",), unlocated=4)
    assert places.describe() == (
        "5 waiting, 0 delayed, 0 running, 1 dead (could not look in: workers (none answered); "
        "4 not looked up, counted as waiting)"
    )


def test_the_alert_names_the_batch_its_stall_and_the_command_to_look_closer() -> None:
    stall = Stall(BATCH, "", SINCE, 4, Places(2, 1, 1, 0))
    short = stall_message(stall, timedelta(seconds=95))
    assert short == (
        f"batch {BATCH} has made no progress for 95 s (since 2026-03-02T09:05:00+00:00): "
        "4 children outstanding: 2 waiting, 1 delayed, 1 running, 0 dead; "
        f"see platform-tasks batches show {BATCH}"
    )
    named = Stall(BATCH, "nightly export", SINCE, 4, Places(2, 1, 1, 0))
    assert stall_message(named, timedelta(hours=2)).startswith(
        f"batch {BATCH} (nightly export) has made no progress for 120 min"
    )
