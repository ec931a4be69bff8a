"""The worker's pause step against real Redis and PostgreSQL, on a consumer stand-in that
records the calls Celery's ``cancel_consumer``/``add_consumer`` make; and the gate it
shares with the marketing yield, so neither resumes a queue the other holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from platform_tasks.app import create_app
from platform_tasks.notifications.marketing_yield import YIELD_REASON
from platform_tasks.operations import pause_queue, paused_queues, resume_queue
from platform_tasks.operations.queue_gate import hold, release
from platform_tasks.operations.worker import QueuePauseStep
from platform_tasks.settings import PlatformSettings


class Timer:
    def call_repeatedly(self, secs: float, fun: Callable[..., Any], args: Any = (),
                        priority: int = 0) -> Any:  # fmt: skip
        return self

    def cancel(self) -> None:
        pass


class ConsumerStandIn:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.timer = Timer()
        self.asked: list[tuple[str, str]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)

    def cancel_task_queue(self, queue: str) -> None:
        self.asked.append(("cancel", queue))

    def add_task_queue(self, queue: str) -> None:
        self.asked.append(("add", queue))


def _look(step: QueuePauseStep, c: ConsumerStandIn) -> None:
    """One read of the flags and the event loop's turn on it."""
    assert step.reader is not None
    step.reader.read_once()
    step.tick(c)


def test_pause_and_resume_reach_the_consumer_and_a_worker_started_paused_starts_paused(
    settings: PlatformSettings,
) -> None:
    app = create_app("pause_step_app", settings=settings)
    pause_queue(settings, "default", actor="ops")
    assert [p.queue for p in paused_queues(settings)] == ["default"]

    c = ConsumerStandIn(app)
    step = QueuePauseStep(c)
    step.start(c)  # the flag is read before the first message is fetched
    try:
        assert c.asked == [("cancel", "default")]
        _look(step, c)
        assert c.asked == [("cancel", "default")]  # nothing new: still paused
        resume_queue(settings, "default", actor="ops")
        _look(step, c)
        assert c.asked == [("cancel", "default"), ("add", "default")]
        assert paused_queues(settings) == []
    finally:
        step.stop(c)


def test_marketing_yield_and_operator_pause_do_not_undo_each_other(
    settings: PlatformSettings,
) -> None:
    app = create_app("pause_step_app", settings=settings)
    c = ConsumerStandIn(app)
    step = QueuePauseStep(c)
    step.start(c)
    try:
        assert c.asked == []
        hold(c, "default", YIELD_REASON)  # the yield pauses first
        pause_queue(settings, "default")
        _look(step, c)
        release(c, "default", YIELD_REASON)  # transactional drained: the yield resumes
        assert c.asked == [("cancel", "default")]  # still paused by the operator
        hold(c, "default", YIELD_REASON)
        resume_queue(settings, "default")
        _look(step, c)
        assert c.asked == [("cancel", "default")]  # still held by the yield
        release(c, "default", YIELD_REASON)
        assert c.asked == [("cancel", "default"), ("add", "default")]
    finally:
        step.stop(c)
