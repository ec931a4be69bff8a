"""``QueueBound``: a batch waits until it fits under the bound, then gives up at the deadline."""

from __future__ import annotations

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.fanout.backpressure import QueueBound, QueueFull
from platform_tasks.settings import PlatformSettings


class Clock:
    """Explicit time: ``sleep`` moves it forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_batch_that_fits_is_published_at_once() -> None:
    clock = Clock()
    bound = QueueBound(500, clock=clock, sleep=clock.sleep)
    bound.wait_for_room("q", lambda: 400, 100)
    assert (clock.now, bound.waits) == (0.0, 0)


def test_a_batch_waits_until_the_consumers_made_room() -> None:
    clock = Clock()
    depths = iter([500, 450, 401, 400])
    bound = QueueBound(500, poll_seconds=0.5, clock=clock, sleep=clock.sleep)
    bound.wait_for_room("q", lambda: next(depths), 100)
    assert (clock.now, bound.waits) == (1.5, 1)


def test_a_queue_that_stays_full_raises_at_the_end_of_the_wait() -> None:
    clock = Clock()
    bound = QueueBound(500, wait_seconds=10, poll_seconds=1, clock=clock, sleep=clock.sleep)
    with pytest.raises(QueueFull, match=r"queue 'q' holds 450 message\(s\), bound 500") as info:
        bound.wait_for_room("q", lambda: 450, 100)
    assert (info.value.depth, clock.now) == (450, 10)


def test_the_bound_setting_must_hold_a_whole_batch() -> None:
    expected = r"PLATFORM_FANOUT_MAX_QUEUE_DEPTH.*at least PLATFORM_FANOUT_BATCH_SIZE \(500\)"
    with pytest.raises(SettingsError, match=expected):
        PlatformSettings.from_env({"PLATFORM_FANOUT_MAX_QUEUE_DEPTH": "100"})
    with pytest.raises(SettingsError, match="PLATFORM_FANOUT_MAX_QUEUE_DEPTH"):
        PlatformSettings.from_env({"PLATFORM_FANOUT_MAX_QUEUE_DEPTH": "0"})
    settings = PlatformSettings.from_env(
        {"PLATFORM_FANOUT_BATCH_SIZE": "50", "PLATFORM_FANOUT_MAX_QUEUE_DEPTH": "50"}
    )
    assert (settings.fanout_batch_size, settings.fanout_max_queue_depth) == (50, 50)
    assert PlatformSettings.from_env({}).fanout_max_queue_depth == 10_000
