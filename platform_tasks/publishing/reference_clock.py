"""The publish time of a job, on a clock every publisher and the cancel share.

A cancel rule takes the jobs published before it (``platform_publish_time``). Were that
time each publisher's own clock, a publisher an hour ahead would publish "after" every
cancel made in that hour, and one behind "before" cancels made after its publish. So a
publish time is the publisher's clock corrected by its offset to the platform Redis's
``TIME``, and a cancel's cutoff is that same ``TIME``: one clock, whoever publishes.

The offset is measured with one ``TIME`` call (corrected by half its round trip) at the
first publish and again every :data:`REFRESH_SECONDS`; a publish never waits for more
than one short call. While the platform Redis cannot be read the last offset is kept (0
before any reading: the local clock), looked at again after :data:`RETRY_SECONDS`, and
said once in the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.brokers.server_time import redis_time
from platform_tasks.settings import PlatformSettings

__all__ = ["REFRESH_SECONDS", "RETRY_SECONDS", "ReferenceClock", "redis_time", "shared_clock"]

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 300.0
"""How often the offset is measured again (clocks drift by well under a millisecond in
this time)."""

RETRY_SECONDS = 30.0
"""How soon an offset that could not be measured is tried again."""

TIMEOUT_SECONDS = 1.0


class ReferenceClock:
    """Now on the platform Redis's clock, read from the local clock plus a measured offset."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        local: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.local = local
        self.monotonic = monotonic
        self.offset = 0.0
        self._next_at: float | None = None
        self._warned = False
        self._lock = threading.Lock()
        self._client: Any = None

    def now(self) -> float:
        """Unix seconds on the reference clock."""
        due = self._next_at is None or self.monotonic() >= self._next_at
        if due and self._lock.acquire(blocking=False):  # one measurement at a time
            try:
                self._measure()
            finally:
                self._lock.release()
        return self.local() + self.offset

    def _measure(self) -> None:
        try:
            if self._client is None:
                self._client = build_redis(
                    self.settings, timeout=TIMEOUT_SECONDS, single_attempt=True
                )
            sent = self.local()
            server = redis_time(self._client)
            received = self.local()
        except REDIS_ERRORS as exc:
            self._next_at = self.monotonic() + RETRY_SECONDS
            if not self._warned:
                self._warned = True
                logger.warning(
                    "publish times use this host's clock: the platform Redis's TIME is "
                    "unreadable (%s)",
                    type(exc).__name__,
                    extra={"event": "publishing.reference_clock_unreadable"},
                )
            return
        self.offset = server - (sent + received) / 2
        self._warned = False
        self._next_at = self.monotonic() + REFRESH_SECONDS

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


_shared: dict[tuple[int, str], ReferenceClock] = {}
_shared_lock = threading.Lock()


def shared_clock(settings: PlatformSettings) -> ReferenceClock:
    """This process's reference clock for ``settings``' Redis (fan-out publishers share it)."""
    key = (os.getpid(), settings.redis_url)
    with _shared_lock:
        clock = _shared.get(key)
        if clock is None:
            clock = _shared[key] = ReferenceClock(settings)
        return clock
