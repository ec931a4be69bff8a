"""The running marker: which worker runs a job now, since when, and how far it got.

A job costs nothing in any store while it waits or once it ended that it would not cost
anyway; only while its handler runs does it have a marker of its own: one Redis hash
written when the handler starts (host, pid, attempt, consumer, queue, since) with a TTL
of the job's time limit, and deleted once its transaction ended: at once when it is
retried or dead-lettered, with the next job's start write when it was applied (its
committed claim answers ``applied`` before any marker is read, so one round trip a job
is enough). A worker killed mid-job leaves the marker until the TTL, and the job's next
delivery writes it again.

``report_progress(done, total, note)`` adds ``done``/``total``/``note`` to that hash. A
handler may call it in a tight loop: a call within :data:`PROGRESS_INTERVAL_SECONDS` of
the last write stores nothing and costs a clock read; the first call after the interval
writes its own value (so the last value reported in a job's final second may never be
shown: progress is a hint, and it expires with the marker).

Every marker write is best effort: a Redis that does not answer never fails or delays a
job beyond the client's short timeout (and none is tried for a few seconds after a
failure); such a job reads ``waiting`` (fetched by a worker) while it runs, the stores
that decide its fate being PostgreSQL's.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.keys import running_key

__all__ = [
    "PROGRESS_INTERVAL_SECONDS",
    "JobMarker",
    "RunningMarkers",
    "report_progress",
]

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_SECONDS = 1.0
"""At most one progress write per job per this many seconds."""

DOWN_SECONDS = 5.0
"""After a failed marker write, how long no marker is written (jobs never wait on a
Redis that is down; they read ``unknown`` meanwhile)."""

MIN_TTL_SECONDS = 60
"""A marker lives at least this long even for a job with a short time limit."""


class RunningMarkers:
    """Writes and deletes the running markers of one worker process."""

    def __init__(
        self,
        connect: Callable[[], Any],
        profile: str,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._connect = connect
        self._client: Any = None
        self.profile = profile
        self.host = host or socket.gethostname()
        self.clock = clock
        self._down_until = 0.0
        self._applied: str | None = None
        """The marker of the last job, applied: deleted with the next job's start."""

    def client(self) -> Any:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def start(
        self, job_id: str, *, consumer: str, queue: str | None, attempt: int, ttl_seconds: int
    ) -> None:
        """Write the job's marker (one round trip: ``HSET`` and ``EXPIRE`` pipelined, with
        the ``DEL`` of the previous applied job's marker)."""
        key = running_key(self.profile, job_id)
        fields = {
            "host": self.host,
            "pid": os.getpid(),
            "attempt": attempt,
            "consumer": consumer,
            "queue": queue or "",
            "since": int(self.clock() * 1000),
        }
        stale = running_key(self.profile, self._applied) if self._applied else None
        self._applied = None
        self._best_effort("start", lambda c: _write(c, key, fields, ttl_seconds, stale))

    def progress(self, job_id: str, fields: dict[str, Any]) -> None:
        """Add progress fields to the marker (its TTL unchanged)."""
        key = running_key(self.profile, job_id)
        self._best_effort("progress", lambda c: c.hset(key, mapping=fields))

    def end(self, job_id: str, *, applied: bool = False) -> None:
        """The job's attempt is over. An applied job's marker is deleted with the next
        job's start write (one round trip per job instead of two): until then it is
        stale but harmless, as its committed claim answers ``applied`` first. Any other
        ending (a retry, a dead letter) deletes it now, or it would read ``running``."""
        if applied:
            self.flush()
            self._applied = job_id
            return
        self._best_effort("end", lambda c: c.delete(running_key(self.profile, job_id)))

    def flush(self) -> None:
        """Delete the applied job's marker still waiting for the next start."""
        stale, self._applied = self._applied, None
        if stale is not None:
            self._best_effort("end", lambda c: c.delete(running_key(self.profile, stale)))

    def close(self) -> None:
        self.flush()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _best_effort(self, step: str, call: Callable[[Any], Any]) -> None:
        if self._down_until and time.monotonic() < self._down_until:
            return  # Redis failed a moment ago: jobs do not wait on it again meanwhile
        try:
            call(self.client())
            self._down_until = 0.0
        except REDIS_ERRORS as exc:
            self._down_until = time.monotonic() + DOWN_SECONDS
            logger.debug(
                "running marker not written (%s): %s",
                step,
                exc,
                extra={"event": "jobs_status.marker_not_written", "step": step},
            )


def _write(
    client: Any, key: str, fields: dict[str, Any], ttl_seconds: int, stale: str | None
) -> None:
    pipe = client.pipeline(transaction=False)
    if stale is not None:
        pipe.delete(stale)
    pipe.hset(key, mapping=fields)
    pipe.expire(key, max(MIN_TTL_SECONDS, ttl_seconds))
    pipe.execute()


class JobMarker:
    """One attempt's marker: started once the job was admitted (a job its limits send back
    to wait never gets one), ended after its transaction did, so there is no moment
    between "running" and "applied" when the job reads as neither."""

    def __init__(
        self,
        markers: RunningMarkers | None,
        job_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.markers = markers
        self.job_id = job_id
        self.clock = clock
        self.started = False
        self.applied = False
        """Set once the job's work committed (its marker may then be deleted later)."""
        self.written_at: float | None = None

    def start(self, *, consumer: str, queue: str | None, attempt: int, ttl_seconds: int) -> None:
        if self.markers is None:
            return
        self.started = True
        self.markers.start(
            self.job_id, consumer=consumer, queue=queue, attempt=attempt, ttl_seconds=ttl_seconds
        )

    @contextmanager
    def reporting(self) -> Iterator[None]:
        """Around the handler: :func:`report_progress` reaches this marker."""
        if not self.started:
            yield
            return
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    def end(self) -> None:
        """Delete the marker (never raises: called from ``finally`` blocks)."""
        if self.started and self.markers is not None:
            self.started = False
            self.markers.end(self.job_id, applied=self.applied)


_current: contextvars.ContextVar[JobMarker | None] = contextvars.ContextVar(
    "platform_jobs_status_marker", default=None
)


def report_progress(done: float, total: float | None = None, note: str | None = None) -> bool:
    """Say how far the running job got; ``jobs show`` and the console show it.

    Call it as often as is convenient: at most one write per second reaches Redis, the
    other calls return ``False`` having stored nothing. Outside a running PlatformTask
    (a unit test calling the handler directly) it does nothing and returns ``False``.
    ``note`` is cut to 200 characters; it is shown to every console viewer, so it must
    not carry customer data.
    """
    if isinstance(done, bool) or not isinstance(done, int | float):
        raise TypeError(f"report_progress: done must be a number, got {done!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int | float)):
        raise TypeError(f"report_progress: total must be a number or None, got {total!r}")
    reporter = _current.get()
    if reporter is None or reporter.markers is None:
        return False
    now = reporter.clock()
    if reporter.written_at is not None and now - reporter.written_at < PROGRESS_INTERVAL_SECONDS:
        return False
    reporter.written_at = now
    fields: dict[str, Any] = {"done": done, "at": int(time.time() * 1000)}
    fields["total"] = "" if total is None else total
    fields["note"] = (note or "")[:200]
    reporter.markers.progress(reporter.job_id, fields)
    return True
