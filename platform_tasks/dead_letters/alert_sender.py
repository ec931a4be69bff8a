"""The alert sender: a thread in every worker that turns dead letters into incidents.

The delivery pipeline never calls an incident sink. It writes the dead letter, whose
``INSERT`` also queues it in ``core.alert_outbox``, and commits; from then on the alert
is this thread's business, in three steps per pass (every
``PLATFORM_ALERT_SEND_INTERVAL_SECONDS``):

1. count the queued dead letters into their groups (queue + kind + error type) in
   ``core.alert_incidents``: a new group, or one resolved before, is to be opened;
2. resolve every open group with no dead letter pending review left, whatever replayed
   or discarded them (CLI, console, bulk operation), with a note of what did;
3. call the sink for each group whose call is due: open its incident with the counts,
   the tenants, first and last seen, an example and the commands to review it; or
   resolve it. A call that fails (unreachable, 5xx, timeout, refused token) is logged
   and tried again ``PLATFORM_ALERT_RETRY_SECONDS`` later from what the table records.

So one problem is one incident (further dead letters of an open group send nothing), an
alert survives any sink outage and any worker restart, and a sink that hangs holds up
this thread only, one bounded call at a time, never a job. Every worker runs a sender;
they share the work through the tables (``SKIP LOCKED``, a lease per call).

Sentry is not driven from here: it keeps its per-dead-letter event (with the traceback),
sent by the pipeline's alert hook through sentry-sdk's own background queue.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

import psycopg2
from celery import bootsteps
from psycopg2.extensions import connection as Connection

from platform_tasks.background import BackgroundThread
from platform_tasks.dead_letters import incidents
from platform_tasks.dead_letters.incidents import Claimed, GroupSummary
from platform_tasks.observability.betterstack import (
    BetterStackIncidents,
    IncidentText,
    SinkCallFailed,
)
from platform_tasks.settings import PlatformSettings, redact_url, without_secrets

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["AlertSender", "AlertSenderStep", "incident_text", "install"]

logger = logging.getLogger("platform_tasks.alerts")

CONNECT_TIMEOUT_SECONDS = 5
STATEMENT_TIMEOUT_MS = 30_000
"""No statement of the sender waits longer on PostgreSQL (a lock, a slow disk)."""
STOP_WAIT_SECONDS = 2.0
"""How long a worker's shutdown waits for the sender's thread."""
MAX_BACKOFF_SECONDS = 60.0
"""The longest wait after passes that failed on PostgreSQL itself."""


def incident_text(group: Claimed, summary: GroupSummary) -> IncidentText:
    """The incident of one group: what failed, how much, for whom, and how to review it."""
    queue = group.queue or "<unknown queue>"
    kind = group.kind or "<unknown kind>"
    tenants = ", ".join(summary.some_tenants)
    if summary.tenants > len(summary.some_tenants):
        tenants += f" and {summary.tenants - len(summary.some_tenants)} more"
    filters = []
    if group.queue:
        filters.append(f"--queue {_quote(group.queue)}")
    if group.kind:
        filters.append(f"--kind {_quote(group.kind)}")
    filters.append(f"--error-type {_quote(group.error_type)}")
    lines = [
        f"Jobs of kind {kind} on queue {queue} were dead-lettered with {group.error_type}.",
        "",
        f"Dead letters pending review: {summary.pending}",
        f"Tenants affected: {summary.tenants}" + (f" ({tenants})" if tenants else ""),
        f"First seen: {_when(summary.first_seen or group.opened_at)}",
        f"Last seen: {_when(summary.last_seen or group.last_seen_at)}",
    ]
    if summary.example_id is not None:
        lines.append(
            f"Example: dead letter {summary.example_id}"
            + (f", job {summary.example_job_id}" if summary.example_job_id else "")
            + (f" ({summary.reason})" if summary.reason else "")
        )
    lines += [
        "",
        "Review:",
    ]
    if summary.example_id is not None:
        lines.append(f"  platform-tasks dead-letters show {summary.example_id}")
    lines += [
        f"  platform-tasks dead-letters replay {' '.join(filters)} --dry-run",
        "",
        "This incident is resolved when no dead letter of this group is pending review "
        "(replayed or discarded). Further dead letters of the group do not open another.",
    ]
    return IncidentText(
        summary=f"Dead letters: {group.error_type} in {kind} on queue {queue}",
        name=f"platform-tasks dead letters ({queue})",
        description="\n".join(lines),
    )


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _when(value: Any) -> str:
    return value.isoformat() if value is not None else "unknown"


class AlertSender(BackgroundThread):
    """One pass at a time of counting, resolving and calling; run as a thread by
    :meth:`start` or pass by pass (:meth:`run_pass`) by tests and tools."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        sink: BetterStackIncidents | None = None,
        name: str = "platform-alert-sender",
    ) -> None:
        if settings.database_url is None:
            raise ValueError("the alert sender needs PLATFORM_DATABASE_URL")
        self.settings = settings
        self.database_url = settings.database_url
        self.sink = sink if sink is not None else BetterStackIncidents.from_settings(settings)
        self.name = name
        self.interval = settings.alert_send_interval_seconds
        self.retry_seconds = settings.alert_retry_seconds
        # a lease outlives any call: connect, send and read, each bounded by the timeout
        self.lease_seconds = settings.alert_timeout_seconds * 4 + 5
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- one pass ------------------------------------------------------------------
    def run_pass(self) -> int:
        """Count, resolve, call what is due; return the number of sink calls made."""
        conn = self._connection()
        if self.sink is None:
            incidents.drain_outbox(conn)
            return 0
        sink = self.sink.sink
        incidents.count_new_dead_letters(conn, sink)
        for group_id, incident_id, note in incidents.resolve_fixed_groups(conn, sink):
            logger.info(
                "dead-letter group %s has nothing pending review: %s",
                group_id,
                note,
                extra={
                    "event": "alert.group_resolved",
                    "sink": sink,
                    "group_id": group_id,
                    "incident_id": incident_id,
                },
            )
        calls = 0
        for group in incidents.claim_due(conn, sink, lease_seconds=self.lease_seconds):
            if self._stop.is_set():
                break
            calls += 1
            self._call(conn, group)
        return calls

    def _call(self, conn: Connection, group: Claimed) -> None:
        assert self.sink is not None
        extra = {
            "sink": self.sink.sink,
            "group_id": group.id,
            "queue": group.queue,
            "kind": group.kind,
            "error_type": group.error_type,
            "attempt": group.attempts,
        }
        try:
            if group.to_send == "open":
                text = incident_text(group, incidents.group_summary(conn, group))
                incident_id = self.sink.open(text)
                incidents.record_opened(conn, group.id, incident_id)
                logger.warning(
                    "incident %s opened: %s",
                    incident_id,
                    text.summary,
                    extra={"event": "alert.incident_opened", "incident_id": incident_id, **extra},
                )
            elif group.to_send == "resolve" and group.incident_id is not None:
                note = group.resolve_note or "platform-tasks: no dead letter pending review"
                self.sink.resolve(group.incident_id, note)
                incidents.record_resolved(conn, group.id)
                logger.info(
                    "incident %s resolved: %s",
                    group.incident_id,
                    note,
                    extra={
                        "event": "alert.incident_resolved",
                        "incident_id": group.incident_id,
                        **extra,
                    },
                )
            else:
                incidents.record_resolved(conn, group.id)
        except SinkCallFailed as exc:
            incidents.record_failed(conn, group.id, str(exc), retry_seconds=self.retry_seconds)
            logger.log(
                logging.ERROR if exc.refused else logging.WARNING,
                "could not %s the incident of dead-letter group %s (attempt %s): %s; "
                "retried in %ss",
                "open" if group.to_send == "open" else "resolve",
                group.id,
                group.attempts,
                exc,
                self.retry_seconds,
                extra={"event": "alert.sink_failed", **extra},
            )

    # --- the thread ----------------------------------------------------------------
    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(
                self.database_url,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name="platform-alert-sender",
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            )
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            # closing a broken connection: nothing more to do if that fails too
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def check_sink(self) -> None:
        """Log a start-up warning when the sink is unreachable or refuses the token.

        A warning, not a refusal to start: incidents wait in the table until the sink
        answers, and a worker that would not start while Better Stack is down would
        cost jobs for an alert. Settings that cannot work (a token without a URL, a URL
        that is not http(s)) are refused before this, when the settings are read.
        """
        if self.sink is None:
            return
        problem = self.sink.check()
        if problem is None:
            logger.info(
                "Better Stack incidents on (%s)",
                redact_url(self.sink.base_url),
                extra={"event": "alert.sink_ready", "sink": self.sink.sink},
            )
            return
        variable, why = problem
        logger.warning(
            "%s: %s; dead-letter incidents wait in core.alert_incidents until it answers",
            variable,
            why,
            extra={"event": "alert.sink_unreachable", "sink": self.sink.sink, "setting": variable},
        )

    def _loop(self) -> None:
        failures = 0
        try:
            try:
                self.check_sink()
            except Exception:  # a check that breaks must not stop the sender
                logger.exception("alert sink check failed", extra={"event": "alert.sender_failed"})
            while not self._stop.is_set():
                wait = self.interval
                try:
                    self.run_pass()
                    failures = 0
                except Exception as exc:  # never end the thread: incidents would stall
                    failures += 1
                    self._drop_connection()
                    wait = min(MAX_BACKOFF_SECONDS, self.interval * 2.0 ** min(failures, 6))
                    logger.warning(
                        "alert sender pass failed (%s: %s); next in %.1fs",
                        type(exc).__name__,
                        without_secrets(str(exc), self.database_url),
                        wait,
                        extra={"event": "alert.sender_failed"},
                    )
                self._stop.wait(wait)
        finally:
            self._drop_connection()
            if self.sink is not None:
                self.sink.close()

    def close(self) -> None:
        """Close the connection and client of a sender run pass by pass."""
        self._drop_connection()
        if self.sink is not None:
            self.sink.close()


class AlertSenderStep(bootsteps.StartStopStep):
    """Worker bootstep: runs the alert sender in the worker's main process."""

    label = "platform alert sender"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.sender: AlertSender | None = None

    def start(self, worker: Any) -> None:
        settings: PlatformSettings | None = getattr(worker.app, "platform_settings", None)
        if settings is None or settings.database_url is None:
            return
        self.sender = AlertSender(settings)
        self.sender.start()

    def stop(self, worker: Any) -> None:
        """Waits briefly: a call in flight to a hanging sink must not hold up the worker's
        shutdown, and nothing is lost by leaving it (its lease expires and another sender,
        or this worker's next start, makes the call again)."""
        if self.sender is not None:
            self.sender.stop(timeout=STOP_WAIT_SECONDS)
            self.sender = None

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)

    def terminate(self, worker: Any) -> None:
        self.stop(worker)


def install(app: PlatformCelery) -> None:
    """Run an alert sender in every worker of ``app`` that has a database."""
    app.steps["worker"].add(AlertSenderStep)
