"""The one promotion loop, driven by a scripted pass: back-off, log events, moved count, close.

The pass's ``stopping`` event records each sleep the loop asks for and returns at once, so
the test sees the exact waits without sleeping through them.
"""

from __future__ import annotations

import logging
import threading

import pytest

from platform_tasks.publishing.promotion_loop import (
    MAX_BACKOFF_SECONDS,
    PassLog,
    PromotionLoop,
    failure_backoff,
)

logger = logging.getLogger("tests.promotion_loop")


class Unreachable(Exception):
    """Stands for a server the pass cannot reach (an expected error)."""


class RecordingEvent(threading.Event):
    """A stop event whose waits are recorded instead of slept."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return self.is_set()


class ScriptedPass:
    """Each pass takes the next step of ``script``: an exception to raise or a result."""

    log = PassLog(
        logger,
        promoted="scripted jobs promoted",
        failed="scripted promotion failed (%s); retrying",
        failed_unexpectedly="scripted promotion failed unexpectedly; retrying",
    )
    expected_errors: tuple[type[Exception], ...] = (Unreachable,)

    def __init__(self, script: list[Exception | tuple[int, float]]) -> None:
        self.script = list(script)
        self.stopping = RecordingEvent()
        self.finished = threading.Event()
        self.calls: list[str] = []

    @property
    def interval(self) -> float:
        return 0.5

    def open(self) -> None:
        self.calls.append("open")

    def run_pass(self) -> tuple[int, float]:
        step = self.script.pop(0)
        if not self.script:
            self.stopping.set()  # the last step: the loop ends after it
            self.finished.set()
        if isinstance(step, Exception):
            raise step
        return step

    def close(self) -> None:
        self.calls.append("close")


def run(
    script: list[Exception | tuple[int, float]],
) -> tuple[ScriptedPass, PromotionLoop[ScriptedPass]]:
    promotion = ScriptedPass(script)
    loop = PromotionLoop(promotion, name="test-promotion-loop")
    loop.start()
    assert promotion.finished.wait(10), "the loop did not run the whole script"
    loop.stop()
    return promotion, loop


def test_failures_back_off_doubling_and_a_success_resets_them(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a test before this one may have configured logging with disable_existing_loggers
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", True)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    promotion, loop = run(
        [Unreachable("down"), RuntimeError("surprise"), (3, 0.2), Unreachable("down"), (0, 0.5)]
    )
    # 0.5 * 2, 0.5 * 4, then the pass's own wait, then 0.5 * 2 again (the count was reset)
    assert promotion.stopping.waits == [1.0, 2.0, 0.2, 1.0, 0.5]
    assert promotion.calls == ["open", "close"]
    assert loop.moved_total == 3
    events = [(r.levelno, getattr(r, "event", None), r.getMessage()) for r in caplog.records]
    assert events == [
        (logging.WARNING, "delay.promote_failed", "scripted promotion failed (down); retrying"),
        (
            logging.ERROR,
            "delay.promote_failed",
            "scripted promotion failed unexpectedly; retrying",
        ),
        (logging.DEBUG, "delay.promoted", "scripted jobs promoted"),
        (logging.WARNING, "delay.promote_failed", "scripted promotion failed (down); retrying"),
    ]
    assert caplog.records[2].count == 3  # type: ignore[attr-defined]


def test_the_back_off_stops_doubling_and_is_capped() -> None:
    assert [failure_backoff(0.5, n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert failure_backoff(0.1, 6) == failure_backoff(0.1, 60) == pytest.approx(6.4)
    assert failure_backoff(10.0, 1) == 20.0
    assert failure_backoff(10.0, 2) == MAX_BACKOFF_SECONDS


def test_start_twice_runs_one_thread_and_stop_closes_the_pass() -> None:
    promotion = ScriptedPass([(0, 0.5)] * 3)
    loop = PromotionLoop(promotion, name="test-promotion-loop")
    loop.start()
    thread = loop._thread
    loop.start()
    assert loop._thread is thread
    assert promotion.finished.wait(10)
    loop.stop()
    assert loop._thread is None
    assert promotion.calls == ["open", "close"]
