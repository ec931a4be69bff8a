"""Defer a warm stop (SIGTERM/SIGINT) while a beat tick sends the triggers it admitted.

Celery beat's handler for SIGTERM and SIGINT closes the scheduler and raises
``SystemExit`` wherever the main thread is. Arriving between the admission of a tick's
points (their admission scripts have run in Redis) and the sending of their triggers, it
would drop triggers nobody else will send: the points are consumed. Every deploy stops
beat this way, so the schedulers run that stretch inside :meth:`WarmStop.deferred`:

* the first signal is noted and logged (``beat.stop_deferred``); the tick finishes
  sending what it admitted, admits nothing more, and the signal's own handler then runs
  (Celery's: close, exit);
* a second signal, or the stop timeout (``PLATFORM_BEAT_STOP_TIMEOUT_SECONDS``) passing,
  runs that handler at once, so a hung broker cannot make beat unstoppable. The
  scheduler's ``close`` then logs each admitted point it could not send and gives back
  its lease.

Only the main thread receives signals; elsewhere (beat embedded in a worker thread)
nothing is deferred.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["WarmStop"]

logger = logging.getLogger("platform_tasks.warm_stop")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class WarmStop:
    """Signal deferral for one scheduler (see the module docstring)."""

    def __init__(self, *, timeout_seconds: float, owner: str) -> None:
        self.timeout_seconds = timeout_seconds
        self.owner = owner
        self._previous: dict[int, Any] = {}
        self._requested: int | None = None  # the deferred signal
        self._expired = False
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        """A stop was requested during the current deferral."""
        return self._requested is not None

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Run the body with SIGTERM/SIGINT deferred; a deferred signal is delivered to
        its own handler when the body ends (normally or not)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            yield
            return
        for signum in _SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):  # not SIG_IGN/SIG_DFL: nothing of ours to protect then
                self._previous[signum] = handler
                signal.signal(signum, self._defer)
        try:
            yield
        finally:
            self._deliver()

    def _defer(self, signum: int, frame: FrameType | None) -> None:
        if self._requested is not None or self._expired:
            logger.warning(
                "stop forced (%s) while a tick sends its triggers owner=%s",
                "stop timeout" if self._expired else "second signal",
                self.owner,
                extra={"event": "beat.stop_forced"},
            )
            self._requested = signum
            self._deliver()
            return
        self._requested = signum
        logger.warning(
            "stop requested while a tick sends its triggers: finishing them first "
            "(at most %.1f s; a second signal stops at once) owner=%s",
            self.timeout_seconds,
            self.owner,
            extra={"event": "beat.stop_deferred"},
        )
        main = threading.main_thread().ident
        assert main is not None
        timer = threading.Timer(self.timeout_seconds, self._expire, args=(main, signum))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _expire(self, main: int, signum: int) -> None:
        """Timer thread: wake the main thread (interrupting a blocked call) to stop."""
        self._expired = True
        signal.pthread_kill(main, signum)

    def _deliver(self) -> None:
        """Restore the handlers; run the deferred signal's handler (which may raise)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        previous: dict[int, Callable[[int, FrameType | None], Any]] = self._previous
        self._previous = {}
        for restored, handler in previous.items():
            signal.signal(restored, handler)
        requested, self._requested, self._expired = self._requested, None, False
        if requested is not None and requested in previous:
            previous[requested](requested, None)
