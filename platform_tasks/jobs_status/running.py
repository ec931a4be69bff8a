"""The running marker: which worker runs a job now, since when, and how far it got.

A job costs nothing in any store while it waits or once it ended that it would not cost
anyway. Only a job that *keeps* running gets a marker of its own: one Redis hash (host,
pid, attempt, consumer, queue, since) written with a TTL of the job's time limit once the
handler has run for :data:`MARK_AFTER_SECONDS` (by a watcher thread of the worker
process, off the job's path), or at its first progress report, and deleted when its
transaction ended. Jobs shorter than that — nearly all of them — write nothing at all:
while they run they read ``waiting`` (fetched by a worker), a fraction of a second later
``applied``. A worker killed mid-job leaves the marker until the TTL, and the job's next
delivery writes it again.

Marking the job costs its own path a dictionary entry (begin) and its removal (end);
measured against marking every job at its start (one Redis round trip), which cost about
a sixth of a worker's CPU per short job (BENCHMARKS.md, *Job status*).

``report_progress(done, total, note)`` adds ``done``/``total``/``note`` to that hash. A
handler may call it in a tight loop: a call within :data:`PROGRESS_INTERVAL_SECONDS` of
the last write stores nothing and costs a clock read; the first call after the interval
writes its own value (the last value reported in a job's final second may never be
shown: progress is a hint, and it expires with the marker).

Every marker write is best effort: a Redis that does not answer never fails a job, and
for a few seconds after a failure none is tried; such a job reads ``waiting`` (fetched by
a worker) while it runs, the stores that decide its fate being PostgreSQL's.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.keys import running_key

__all__ = [
    "MARK_AFTER_SECONDS",
    "PROGRESS_INTERVAL_SECONDS",
    "JobMarker",
    "RunningMarkers",
    "report_progress",
]

logger = logging.getLogger(__name__)

MARK_AFTER_SECONDS = 0.5
"""A job running longer than this gets its marker (checked every tenth of it)."""

PROGRESS_INTERVAL_SECONDS = 1.0
"""At most one progress write per job per this many seconds."""

DOWN_SECONDS = 5.0
"""After a failed marker write, how long no marker is written."""

MIN_TTL_SECONDS = 60
"""A marker lives at least this long even for a job with a short time limit."""


@dataclass
class Running:
    """One job's run in this process, as the watcher and ``report_progress`` see it."""

    job_id: str
    fields: dict[str, Any]
    ttl_seconds: int
    started: float
    marked: bool = False
    done: bool = False
    progress_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class RunningMarkers:
    """The running markers of one worker process: who is running, and their Redis hashes."""

    def __init__(
        self,
        connect: Callable[[], Any],
        profile: str,
        *,
        host: str | None = None,
        mark_after: float = MARK_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
    ) -> None:
        self._connect = connect
        self._client: Any = None
        self.profile = profile
        self.host = host or socket.gethostname()
        self.mark_after = mark_after
        self.clock = clock
        self.watch = watch
        self._down_until = 0.0
        self._jobs: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._watcher_pid: int | None = None
        self._stop = threading.Event()

    def client(self) -> Any:
        if self._client is None:
            self._client = self._connect()
        return self._client

    # -- the job's path: no I/O unless the job was marked ------------------------------

    def begin(
        self, job_id: str, *, consumer: str, queue: str | None, attempt: int, ttl_seconds: int
    ) -> Running:
        fields = {
            "host": self.host,
            "pid": os.getpid(),
            "attempt": attempt,
            "consumer": consumer,
            "queue": queue or "",
            "since": int(time.time() * 1000),
        }
        running = Running(job_id, fields, max(MIN_TTL_SECONDS, ttl_seconds), self.clock())
        with self._lock:
            self._jobs[job_id] = running
        if self.watch and self._watcher_pid != os.getpid():
            self._start_watcher()
        return running

    def finish(self, running: Running) -> None:
        """The job's transaction ended: forget it, and delete its marker if it had one."""
        with self._lock:
            self._jobs.pop(running.job_id, None)
        with running.lock:  # a write the watcher is making completes first
            running.done = True
            marked = running.marked
        if marked:
            key = running_key(self.profile, running.job_id)
            self._best_effort("end", lambda c: c.delete(key))

    # -- the marker's writes -----------------------------------------------------------

    def mark(self, running: Running, progress: dict[str, Any] | None = None) -> None:
        """Write the marker (and ``progress``) unless the job has ended meanwhile."""
        key = running_key(self.profile, running.job_id)
        with running.lock:
            if running.done:
                return
            if running.marked and progress is not None:
                self._best_effort("progress", lambda c: c.hset(key, mapping=progress))
                return
            fields = {**running.fields, **(progress or {})}
            if self._best_effort("start", lambda c: _write(c, key, fields, running.ttl_seconds)):
                running.marked = True

    def due(self) -> list[Running]:
        """The jobs running longer than ``mark_after`` and not marked yet."""
        now = self.clock()
        with self._lock:
            return [
                r
                for r in self._jobs.values()
                if not r.marked and now - r.started >= self.mark_after
            ]

    def _start_watcher(self) -> None:
        with self._lock:
            if self._watcher_pid == os.getpid():
                return
            self._watcher_pid = os.getpid()  # a forked pool process starts its own
        thread = threading.Thread(target=self._watch, name="platform-running-markers", daemon=True)
        thread.start()

    def _watch(self) -> None:
        interval = max(0.01, self.mark_after / 5)
        while not self._stop.wait(interval):
            for running in self.due():
                self.mark(running)

    def close(self) -> None:
        self._stop.set()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _best_effort(self, step: str, call: Callable[[Any], Any]) -> bool:
        if self._down_until and time.monotonic() < self._down_until:
            return False  # Redis failed a moment ago: not tried again meanwhile
        try:
            call(self.client())
            self._down_until = 0.0
            return True
        except REDIS_ERRORS as exc:
            self._down_until = time.monotonic() + DOWN_SECONDS
            logger.debug(
                "running marker not written (%s): %s",
                step,
                exc,
                extra={"event": "jobs_status.marker_not_written", "step": step},
            )
            return False


def _write(client: Any, key: str, fields: dict[str, Any], ttl_seconds: int) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, mapping=fields)
    pipe.expire(key, ttl_seconds)
    pipe.execute()


class JobMarker:
    """One attempt's place among the running jobs: begun once the job was admitted (a job
    its limits send back to wait is never marked), finished after its transaction ended,
    so there is no moment between "running" and "applied" when it reads as neither."""

    def __init__(
        self,
        markers: RunningMarkers | None,
        job_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.markers = markers
        self.job_id = job_id
        self.clock = clock
        self.running: Running | None = None

    def start(self, *, consumer: str, queue: str | None, attempt: int, ttl_seconds: int) -> None:
        if self.markers is not None:
            self.running = self.markers.begin(
                self.job_id,
                consumer=consumer,
                queue=queue,
                attempt=attempt,
                ttl_seconds=ttl_seconds,
            )

    @contextmanager
    def reporting(self) -> Iterator[None]:
        """Around the handler: :func:`report_progress` reaches this job."""
        if self.running is None:
            yield
            return
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    def end(self) -> None:
        """Finish the job's run (never raises: called from ``finally`` blocks)."""
        if self.running is not None and self.markers is not None:
            running, self.running = self.running, None
            self.markers.finish(running)


_current: contextvars.ContextVar[JobMarker | None] = contextvars.ContextVar(
    "platform_jobs_status_marker", default=None
)


def report_progress(done: float, total: float | None = None, note: str | None = None) -> bool:
    """Say how far the running job got; ``jobs show`` and the console show it.

    Call it as often as is convenient: at most one write per second reaches Redis (the
    first one also writes the job's running marker), the other calls return ``False``
    having stored nothing. Outside a running PlatformTask (a unit test calling the handler
    directly) it does nothing and returns ``False``. ``note`` is cut to 200 characters; it
    is shown to every console viewer, so it must not carry customer data.
    """
    if isinstance(done, bool) or not isinstance(done, int | float):
        raise TypeError(f"report_progress: done must be a number, got {done!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int | float)):
        raise TypeError(f"report_progress: total must be a number or None, got {total!r}")
    marker = _current.get()
    running = marker.running if marker is not None else None
    if marker is None or marker.markers is None or running is None:
        return False
    now = marker.clock()
    if running.progress_at is not None and now - running.progress_at < PROGRESS_INTERVAL_SECONDS:
        return False
    running.progress_at = now
    fields: dict[str, Any] = {"done": done, "at": int(time.time() * 1000)}
    fields["total"] = "" if total is None else total
    fields["note"] = (note or "")[:200]
    marker.markers.mark(running, fields)
    return True
