"""How long the Redis delay promoter sleeps after a pass, from when the next entry is due."""

from __future__ import annotations

import pytest

from platform_tasks.publishing.promotion_loop import MIN_WAIT_SECONDS, wait_until_next_due


@pytest.mark.parametrize(
    ("next_due_in_ms", "expected"),
    [
        (None, 0.5),  # nothing waiting: poll as before
        (120, 0.12),  # due soon: wake then
        (499, 0.499),
        (500, 0.5),
        (60_000, 0.5),  # due later than the poll: entries added meanwhile are seen
        (3, MIN_WAIT_SECONDS),  # never spin
        (0, MIN_WAIT_SECONDS),  # still due (a full batch): not a busy loop either
    ],
)
def test_waits_until_the_next_entry_is_due_within_the_poll_interval(
    next_due_in_ms: int | None, expected: float
) -> None:
    assert wait_until_next_due(next_due_in_ms, 0.5) == pytest.approx(expected)
