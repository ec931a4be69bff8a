"""A daemon thread that runs a loop inside every worker and beat until it is stopped.

The delay promotion loop, the outbox relay and the alert sender each run one beside the
Celery consumer. Starting twice must do nothing and stopping must wait a bounded time, the
same way for all of them, so that rule lives here once; each owns its loop (``_loop``),
the event it watches (``_stop``) and what it opens or wakes around a start and a stop.
"""

from __future__ import annotations

import threading

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """Start and stop a daemon thread running ``self._loop``.

    A subclass sets ``name``, ``_stop`` (the event its loop watches) and ``_thread = None``
    in its constructor, and may override :meth:`_starting` (before the thread starts),
    :meth:`_stopping` (after the stop event is set: wake a waiting loop) and
    :meth:`_stopped` (after the thread ended or the wait timed out).
    """

    name: str
    _stop: threading.Event
    _thread: threading.Thread | None

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start the thread; a second call while it runs does nothing."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._starting()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the loop to stop after its current step and wait up to ``timeout``."""
        self._stop.set()
        self._stopping()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._stopped()

    def _starting(self) -> None:
        """Before the thread starts."""

    def _stopping(self) -> None:
        """Right after the stop was asked."""

    def _stopped(self) -> None:
        """After the thread ended (or the wait for it timed out)."""
