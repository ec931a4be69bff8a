"""``WarmStop`` with real signals sent to this process: a first SIGTERM inside the
deferral waits for the body, a second one or the timeout runs the handler at once, and
outside a deferral (or off the main thread) the handler runs as usual."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from platform_tasks.jobs.warm_stop import WarmStop


class _Stopped(Exception):
    pass


@pytest.fixture
def handled() -> Iterator[list[str]]:
    """A SIGTERM handler like Celery beat's (record, then raise); the old one restored."""
    calls: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        calls.append(signal.Signals(signum).name)
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield calls
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_first_signal_waits_for_the_body(handled: list[str]) -> None:
    warm_stop = WarmStop(timeout_seconds=60, owner="test")
    finished = []
    with pytest.raises(_Stopped), warm_stop.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        assert warm_stop.requested and handled == []
        finished.append(True)
    assert finished == [True] and handled == ["SIGTERM"]
    assert not warm_stop.requested


def test_second_signal_stops_at_once(handled: list[str]) -> None:
    warm_stop = WarmStop(timeout_seconds=60, owner="test")
    reached = []
    with pytest.raises(_Stopped), warm_stop.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append(True)
    assert reached == [] and handled == ["SIGTERM"]


def test_timeout_interrupts_a_blocked_body(handled: list[str]) -> None:
    warm_stop = WarmStop(timeout_seconds=0.2, owner="test")
    with pytest.raises(_Stopped), warm_stop.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)  # a hung broker: only the timeout ends it
        pytest.fail("the timeout did not stop the body")
    assert handled == ["SIGTERM"]


def test_handlers_are_restored_and_nothing_is_deferred_outside(handled: list[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    warm_stop = WarmStop(timeout_seconds=60, owner="test")
    with warm_stop.deferred():
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
    with pytest.raises(_Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
    assert handled == ["SIGTERM"]


def test_off_the_main_thread_nothing_is_deferred(handled: list[str]) -> None:
    warm_stop = WarmStop(timeout_seconds=60, owner="test")
    seen = []

    def body() -> None:
        with warm_stop.deferred():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=30)
    assert seen == [signal.getsignal(signal.SIGTERM)]
