"""The stall watchdog: one alert when a batch has children outstanding and no progress.

A batch whose children stop ending (a handler that hangs, a queue nobody consumes, a
delay far in the future, a child lost before it was published) never fires
``on_complete``, and nothing else would say so. Every worker runs this watchdog as a
thread; every ``PLATFORM_BATCH_WATCH_INTERVAL_SECONDS`` it looks for batches whose last
progress (``progressed_at``, or the newest child ending, whichever is later) is older
than ``PLATFORM_BATCH_STALL_SECONDS``, and raises one alert per stall naming how many
children are waiting, delayed, running and dead (see
:mod:`~platform_tasks.batches.locator`).

One alert per stall, whichever worker sees it first: ``core.batches.stall_alerted_at``
is set by one ``UPDATE`` that matches only while it is older than the last progress, so
the other watchdogs' ``UPDATE`` matches nothing. A batch that progresses again and then
stalls again is a new stall, alerted again. An alert that could not be sent (the
locator or the alert itself raised) clears the mark, so the next pass tries again.

Time is the database's ``now()`` unless a pass is given ``now`` (tests drive the
watchdog pass by pass with an injected clock).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg2
from celery import bootsteps
from psycopg2.extensions import connection as Connection

from platform_tasks.background import BackgroundThread
from platform_tasks.batches import status
from platform_tasks.batches.locator import WorkerAndDelayLocator
from platform_tasks.observability.alerts import send_alert
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings, without_secrets

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["BatchWatchdog", "BatchWatchdogStep", "Stall", "install", "stall_message"]

logger = logging.getLogger("platform_tasks.batches.watchdog")

CANDIDATES_PER_PASS = 100
STATEMENT_TIMEOUT_MS = 30_000
STOP_WAIT_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 300.0


@dataclass(frozen=True)
class Stall:
    """One alerted stall: the batch, since when it made no progress, where its children are."""

    batch_id: uuid.UUID
    description: str
    last_progress: datetime
    outstanding: int
    places: status.Places


def stall_message(stall: Stall, stalled_for: timedelta) -> str:
    """The alert's text: which batch, for how long, and where its children are."""
    name = f" ({stall.description})" if stall.description else ""
    seconds = stalled_for.total_seconds()
    span = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
    return (
        f"batch {stall.batch_id}{name} has made no progress for {span} "
        f"(since {stall.last_progress.isoformat()}): {stall.outstanding} children outstanding: "
        f"{stall.places.describe()}; see platform-tasks batches show {stall.batch_id}"
    )


class BatchWatchdog(BackgroundThread):
    """Looks for stalled batches pass by pass; run as a thread by :meth:`start`."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        locator: status.ChildLocator | None = None,
        alert: Callable[[Stall, str], None] | None = None,
        name: str = "platform-batch-watchdog",
    ) -> None:
        if settings.database_url is None:
            raise ValueError("the batch watchdog needs PLATFORM_DATABASE_URL")
        self.settings = settings
        self.database_url = settings.database_url
        self.stall_after = timedelta(seconds=settings.batch_stall_seconds)
        self.interval = settings.batch_watch_interval_seconds
        self.locator = locator if locator is not None else WorkerAndDelayLocator(settings)
        self.alert = alert if alert is not None else _send
        self.name = name
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_pass(self, now: datetime | None = None) -> list[Stall]:
        """Alert every stall not alerted yet; return them. ``now``: the clock (default:
        the database's)."""
        conn = self._connection()
        queries = load_queries("batch_status")
        with conn, conn.cursor() as cur:
            if now is None:
                cur.execute("SELECT now()")
                now = cur.fetchone()[0]
            cur.execute(
                queries["stall_candidates"],
                {"cutoff": now - self.stall_after, "limit": CANDIDATES_PER_PASS},
            )
            candidates = cur.fetchall()
        alerted = []
        for batch_id, description, _created, last_progress, _outstanding in candidates:
            if self._stop.is_set():
                break
            with conn, conn.cursor() as cur:
                cur.execute(
                    queries["claim_stall"],
                    {"batch": batch_id, "now": now, "last_progress": last_progress},
                )
                if cur.fetchone() is None:
                    continue  # another watchdog alerted this stall
            try:
                stall = self._alert(conn, batch_id, description, last_progress, now)
            except Exception:
                with conn, conn.cursor() as cur:
                    cur.execute(queries["release_stall"], {"batch": batch_id, "now": now})
                raise
            if stall is not None:
                alerted.append(stall)
        return alerted

    def _alert(
        self, conn: Connection, batch_id: Any, description: str, last: datetime, now: datetime
    ) -> Stall | None:
        detail = status.show_batch(conn, uuid.UUID(str(batch_id)), tenants_shown=1)
        if detail is None:  # deleted meanwhile
            return None
        found = status.places(conn, detail.summary, self.locator)
        stall = Stall(
            batch_id=detail.summary.batch_id,
            description=description,
            last_progress=last,
            outstanding=detail.summary.counts.outstanding,
            places=found,
        )
        self.alert(stall, stall_message(stall, now - last))
        return stall

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(
                self.database_url,
                connect_timeout=5,
                application_name="platform-batch-watchdog",
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
        self._conn = None

    def _loop(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                wait = self.interval
                try:
                    self.run_pass()
                    failures = 0
                except Exception as exc:  # never end the thread: stalls would go unseen
                    failures += 1
                    self.close()
                    wait = min(MAX_BACKOFF_SECONDS, self.interval * 2.0 ** min(failures, 6))
                    logger.warning(
                        "batch watchdog pass failed (%s: %s); next in %.1fs",
                        type(exc).__name__,
                        without_secrets(str(exc), self.database_url),
                        wait,
                        extra={"event": "batches.watchdog_failed"},
                    )
                self._stop.wait(wait)
        finally:
            self.close()


def _send(stall: Stall, message: str) -> None:
    send_alert(
        message,
        tags={
            "check": "batch_stalled",
            "batch_id": str(stall.batch_id),
            "outstanding": str(stall.outstanding),
            "waiting": str(stall.places.waiting),
            "delayed": str(stall.places.delayed),
            "running": str(stall.places.running),
            "dead": str(stall.places.dead),
        },
        fingerprint=["batch-stalled", str(stall.batch_id)],
        level="warning",
    )


class BatchWatchdogStep(bootsteps.StartStopStep):
    """Worker bootstep: runs the watchdog in the worker's main process."""

    label = "platform batch watchdog"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.watchdog: BatchWatchdog | None = None

    def start(self, worker: Any) -> None:
        settings: PlatformSettings | None = getattr(worker.app, "platform_settings", None)
        if settings is None or settings.database_url is None or not settings.batch_stall_seconds:
            return
        locator = WorkerAndDelayLocator(settings, app=worker.app)
        self.watchdog = BatchWatchdog(settings, locator=locator)
        self.watchdog.start()

    def stop(self, worker: Any) -> None:
        if self.watchdog is not None:
            self.watchdog.stop(timeout=STOP_WAIT_SECONDS)
            self.watchdog = None

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)

    def terminate(self, worker: Any) -> None:
        self.stop(worker)


def install(app: PlatformCelery) -> None:
    """Run a batch watchdog in every worker of ``app`` that has a database."""
    app.steps["worker"].add(BatchWatchdogStep)
