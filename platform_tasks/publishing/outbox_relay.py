"""The outbox relay: committed ``core.outbox`` rows to the broker, in every worker and beat.

Like the delay promoter, a relay thread runs in every worker's main process and every
beat replica, so there is no process for users to run. A pass deletes a batch of
the oldest rows in a transaction (``FOR UPDATE SKIP LOCKED``: any number of relays take
disjoint batches), hands their stored messages to the broker as they are, and commits
the delete only once the broker accepted them:

- Redis: one pipelined round trip per batch, ``LPUSH`` of each wire message onto
  its list (a ``schedule`` row goes into the delay store with its due time instead);
- RabbitMQ: a batch on a confirm-mode channel; only confirmed rows are deleted (a row due
  later goes through the delayed-delivery queues with its countdown, or into the delay
  store on the platform's Redis with ``PLATFORM_RABBITMQ_DELAYS=delay_store``).

A relay killed between the broker's acceptance and its commit leaves the rows locked by a
transaction PostgreSQL rolls back: the next relay publishes them again, with the same job
ids, and the consumers' idempotency rows absorb the copies. Nothing is lost; nothing is
applied twice.

The thread waits on ``LISTEN platform_outbox`` (the table's insert trigger notifies at
commit), so a committed row leaves within a round trip, and on its poll interval
(``PLATFORM_OUTBOX_POLL_INTERVAL_SECONDS``) as a fallback for lost notifications.
Failures back off as the promoter's do
(:func:`~platform_tasks.publishing.promotion_loop.failure_backoff`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg2
import redis
from celery import bootsteps

from platform_tasks.background import BackgroundThread
from platform_tasks.brokers.selection import broker_kind
from platform_tasks.errors import BrokerPublishError
from platform_tasks.observability.outbox_metrics import observe_outbox, outbox_relayed
from platform_tasks.observability.trace_context import current_trace_headers
from platform_tasks.postgres.queries import load_queries
from platform_tasks.publishing.outbox_sinks import AmqpSink, RedisSink, Row
from platform_tasks.publishing.promotion_loop import failure_backoff

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.publishing.queue_port import QueuePort
    from platform_tasks.settings import PlatformSettings

logger = logging.getLogger(__name__)

EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    redis.RedisError,
    BrokerPublishError,
    OSError,
)
"""Failures of an unreachable server: a warning and a retry with back-off."""


class OutboxRelay(BackgroundThread):
    """A background thread relaying committed outbox rows of this profile to the broker."""

    def __init__(
        self, app: PlatformCelery, *, name: str = "platform-outbox-relay", metrics: bool = True
    ) -> None:
        self.app = app
        self.settings: PlatformSettings = app.platform_settings
        self.name = name
        self.relayed_total = 0
        self._measure = metrics and self.settings.metrics_port is not None
        self._sql = load_queries("outbox")
        self._claim = f"{self._sql['claim_begin']};\n{self._sql['claim_batch']}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._sink: RedisSink | AmqpSink | None = None
        self._port: QueuePort | None = None
        self._wake_r, self._wake_w = -1, -1
        self._table_seen = False
        self._told_missing = False

    @property
    def interval(self) -> float:
        return self.settings.outbox_poll_interval_seconds

    # -- connections ---------------------------------------------------------------

    def _open(self) -> None:
        if self._sink is None:
            kind = broker_kind(self.settings.effective_broker_url)
            self._sink = RedisSink(self.settings) if kind == "redis" else AmqpSink(self.app)
        self._open_database()

    def _open_database(self) -> None:
        if self._conn is None:
            conn = self._connect()
            with conn.cursor() as cur:
                cur.execute(self._sql["listen"])
            self._conn = conn
        if not self._table_seen:
            with self._conn.cursor() as cur:
                cur.execute("SELECT to_regclass('core.outbox') IS NOT NULL")
                self._table_seen = bool(cur.fetchone()[0])
            if not self._table_seen and not self._told_missing:
                self._told_missing = True
                logger.info(
                    "outbox relay idle: core.outbox does not exist yet (platform-tasks migrate)",
                    extra={"event": "outbox.table_missing"},
                )

    def _connect(self) -> Any:
        assert self.settings.database_url
        conn = psycopg2.connect(
            self.settings.database_url,
            connect_timeout=5,
            application_name="platform-tasks outbox relay",
        )
        conn.autocommit = True  # each claim sends its own BEGIN
        return conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def close(self) -> None:
        self._close_connection()
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.close()
        port, self._port = self._port, None
        if port is not None:
            port.close()

    # -- one pass ------------------------------------------------------------------

    def _claim_on(self, conn: Any) -> list[Row]:
        """Claim a batch in a new transaction on ``conn`` (left open: :meth:`_deliver`
        commits it); a failure rolls it back or, if that fails too, closes ``conn``."""
        try:
            with conn.cursor() as cur:
                # text columns as bytes: the messages go to the broker as PostgreSQL sent them
                psycopg2.extensions.register_type(psycopg2.extensions.BYTES, cur)
                cur.execute(self._claim, (self.settings.profile, self.settings.outbox_batch_size))
                records = cur.fetchall()
        except BaseException:
            self._roll_back(conn)
            raise
        records.sort()  # by id (unique, first): publish order
        return [
            Row(
                row_id,
                broker.decode(),
                queue.decode(),
                target and target.decode(),
                message,
                entry_id and entry_id.decode(),
                due_ms,
            )
            for row_id, broker, queue, target, message, entry_id, due_ms in records
        ]

    def _roll_back(self, conn: Any) -> None:
        """Give a claimed batch back (its rows are there for the next pass)."""
        if conn.closed:
            return
        try:
            with conn.cursor() as cur:
                cur.execute("ROLLBACK")
        except psycopg2.Error:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def _deliver(self, conn: Any, rows: list[Row]) -> int:
        """Publish a batch claimed on ``conn``, then commit the delete of the rows the
        broker accepted (all of them in the claim's transaction, or, after a partial
        acceptance, only those, on their own); the number of rows relayed."""
        assert self._sink is not None
        try:
            plain = [row for row in rows if row.broker != "unique"]
            accepted = self._sink.publish(plain) if plain else []
            accepted += self._publish_unique([row for row in rows if row.broker == "unique"])
            with conn.cursor() as cur:
                if len(accepted) == len(rows):
                    cur.execute(self._sql["commit_batch"])
                else:  # keep the rows the broker did not accept
                    cur.execute("ROLLBACK")
                    if accepted:
                        cur.execute(self._sql["delete_rows"], (accepted,))
        except BaseException:
            self._roll_back(conn)
            raise
        return len(accepted)

    def _publish_unique(self, rows: list[Row]) -> list[int]:
        """Make the unique publishes of ``rows`` through the queue port (one at a time:
        each takes its key's lock); the ids of the rows done."""
        if not rows:
            return []
        if self._port is None:
            from platform_tasks.publishing.queue_port import QueuePort

            self._port = QueuePort(self.app)
        done = []
        for row in rows:
            request = json.loads(row.message)
            unique = request["unique"]
            token = current_trace_headers.set(request.get("trace") or None)
            try:
                kwargs: dict[str, Any] = {
                    "unique_key": unique["key"],
                    "unique_for": timedelta(milliseconds=unique["ttl_ms"]),
                    "unique_mode": unique["mode"],
                    "tx": None,
                }
                queue, payload, opts = row.queue, request["payload"], request["opts"]
                if row.due_ms is None:
                    self._port.publish(queue, payload, opts, **kwargs)
                else:
                    run_at = datetime.fromtimestamp(row.due_ms / 1000, UTC)
                    self._port.schedule(queue, payload, run_at, opts, **kwargs)
            finally:
                current_trace_headers.reset(token)
            done.append(row.id)
        return done

    def relay_batch(self) -> tuple[int, bool]:
        """Claim, publish and delete one batch; ``(rows relayed, batch was full and
        wholly accepted)``."""
        self._open()
        if not self._table_seen:
            return 0, False
        rows = self._claim_on(self._conn)
        moved = self._deliver(self._conn, rows)
        return moved, len(rows) == self.settings.outbox_batch_size and moved == len(rows)

    def run_once(self) -> int:
        """Relay until no full batch is left; how many rows were relayed.

        One batch at a time: claiming the next batch on a second connection in a helper
        thread while the broker takes the current one measured slower, not faster (each
        thread waits for the GIL at each of its round trips while the other one builds
        rows or commands; BENCHMARKS.md)."""
        total = 0
        while not self._stop.is_set():
            moved, more = self.relay_batch()
            total += moved
            if not more:
                break
        return total

    def measure(self) -> None:
        """Set ``platform_outbox_rows_waiting`` and ``platform_outbox_lag_seconds``."""
        self._open_database()
        with self._conn.cursor() as cur:
            cur.execute(self._sql["measure"], (self.settings.profile,))
            waiting, lag = cur.fetchone()
        observe_outbox(int(waiting), None if lag is None else float(lag))

    def _measure_quietly(self) -> None:
        """Measure after every pass, a failed one too: a relay that cannot reach the broker
        still reports the lag growing (what the stalled-relay alert watches)."""
        if not self._measure:
            return
        try:
            self._open_database()
            if self._table_seen:
                self.measure()
        except EXPECTED_ERRORS:
            self._close_connection()

    # -- the thread ----------------------------------------------------------------

    def _wait(self, seconds: float) -> None:
        """Sleep until a commit notifies, :meth:`stop` is called, or ``seconds`` pass."""
        conn = self._conn
        if conn is None or conn.closed:
            self._stop.wait(seconds)
            return
        if conn.notifies:
            conn.notifies.clear()
            return
        readable, _, _ = select.select([conn, self._wake_r], [], [], seconds)
        if conn in readable:
            conn.poll()
            conn.notifies.clear()

    def _loop(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                wait = self.interval
                try:
                    moved = self.run_once()
                    failures = 0
                    if moved:
                        self.relayed_total += moved
                        outbox_relayed(moved)
                        logger.debug(
                            "relayed outbox rows", extra={"event": "outbox.relayed", "count": moved}
                        )
                except EXPECTED_ERRORS as exc:
                    failures += 1
                    self._close_connection()
                    logger.warning(
                        "outbox relay failed (%s: %s); retrying",
                        type(exc).__name__,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                        extra={"event": "outbox.relay_failed"},
                    )
                except Exception:  # never end the thread: committed jobs would wait forever
                    failures += 1
                    self._close_connection()
                    logger.exception(
                        "outbox relay failed unexpectedly; retrying",
                        extra={"event": "outbox.relay_failed"},
                    )
                self._measure_quietly()
                if failures:
                    self._stop.wait(failure_backoff(self.interval, failures))
                    continue
                try:
                    self._wait(wait)
                except (OSError, ValueError, psycopg2.Error):
                    self._close_connection()
        finally:
            self.close()

    def _starting(self) -> None:
        self._wake_r, self._wake_w = os.pipe()

    def _stopping(self) -> None:
        """Wake a loop waiting for a notification; the current batch commits or rolls back."""
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")

    def _stopped(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r, self._wake_w = -1, -1


def outbox_relay_for(
    app: PlatformCelery, *, name: str = "platform-outbox-relay"
) -> OutboxRelay | None:
    """The relay this app runs, or ``None`` without a database or a broker it can publish
    to (a relay needs PostgreSQL for the rows and a Redis or RabbitMQ broker)."""
    settings: PlatformSettings = app.platform_settings
    if not settings.database_url or not settings.outbox_relay:
        return None
    if broker_kind(settings.effective_broker_url) not in ("redis", "amqp"):
        return None
    return OutboxRelay(app, name=name)


class OutboxRelayStep(bootsteps.StartStopStep):
    """Worker bootstep: runs the outbox relay in the worker's main process."""

    label = "platform outbox relay"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.relay: OutboxRelay | None = None

    def start(self, worker: Any) -> None:
        self.relay = outbox_relay_for(worker.app)
        if self.relay is not None:
            self.relay.start()

    def stop(self, worker: Any) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)

    def terminate(self, worker: Any) -> None:
        """A cold shutdown stops the relay too (see the delay promoter's step)."""
        self.stop(worker)


def install(app: PlatformCelery) -> None:
    """Run an outbox relay in every worker of ``app``."""
    app.steps["worker"].add(OutboxRelayStep)
