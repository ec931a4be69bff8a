"""The worker's pause step against real Redis and PostgreSQL, on a consumer stand-in that
records the calls Celery's ``cancel_consumer``/``add_consumer`` make; and the gate it
shares with the marketing yield, so neither resumes a queue the other holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg2
import pytest

from platform_tasks.app import create_app
from platform_tasks.consumer.queue_gate import hold, release
from platform_tasks.consumer.queue_pause import QueuePauseStep
from platform_tasks.notifications.marketing_yield import YIELD_REASON
from platform_tasks.operations import pause_queue, paused_queues, resume_queue
from platform_tasks.settings import PlatformSettings


class Timer:
    def call_repeatedly(
        self, secs: float, fun: Callable[..., Any], args: Any = (), priority: int = 0
    ) -> Any:
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


def test_a_queue_added_while_the_worker_runs_is_paused_too(settings: PlatformSettings) -> None:
    app = create_app("pause_step_app", settings=settings)
    c = ConsumerStandIn(app)
    step = QueuePauseStep(c)
    step.start(c)
    try:
        pause_queue(settings, "reports", actor="ops")
        app.amqp.queues.select_add("reports")  # what Celery's add_consumer does
        _look(step, c)
        assert c.asked == [("cancel", "reports")]
    finally:
        step.stop(c)
        resume_queue(settings, "reports", actor="ops")


def test_a_pause_whose_row_cannot_commit_sets_no_flag(
    settings: PlatformSettings, database_url: str
) -> None:
    """The operations row commits before the flag is set: a commit that fails (here a
    deferred check refusing the row) leaves no pause that the log does not show."""
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(REFUSE_DOOMED)
        with pytest.raises(psycopg2.Error, match="refused"):
            pause_queue(settings, "doomed", actor="ops")
        assert [p.queue for p in paused_queues(settings)] == []
    finally:
        with conn, conn.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS refuse_doomed ON core.operations")
            cur.execute("DROP FUNCTION IF EXISTS public.refuse_doomed()")
        conn.close()


REFUSE_DOOMED = """
CREATE OR REPLACE FUNCTION public.refuse_doomed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'operation on queue doomed refused';
END $$;
CREATE CONSTRAINT TRIGGER refuse_doomed AFTER INSERT ON core.operations
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.filter->>'queue' = 'doomed') EXECUTE FUNCTION public.refuse_doomed();
"""
