"""``LeaseScheduler``: a Celery beat scheduler any number of replicas can run at once.

Stock beat keeps its schedule in the process, so two replicas double-fire, a restart
catches up missed runs and nothing stops a run overlapping the previous one. Here every
replica discovers the same job files and, at each point, asks Redis once (the admission
script); Redis decides which replica's trigger wins, refuses catch-up and skips a point
while the job's running lease is held. Admitted points are sent to the worker as
``platform.jobs.run`` tasks carrying the lease token.

A tick is batched end to end: the due points are taken from a heap, admitted one
pipeline per batch (one script call per point), and the batch's admitted triggers are
published in one kombu publish batch (one broker round trip) before the next batch is
judged. Beat then sleeps until the next due point.

A warm stop (SIGTERM/SIGINT) arriving while a batch is admitted or its triggers are
sent is deferred until they are sent (:mod:`platform_tasks.jobs.warm_stop`), at most
``PLATFORM_BEAT_STOP_TIMEOUT_SECONDS``; a stop that cuts the send short (the timeout, a
second signal) logs each admitted point whose trigger was not sent and gives back its
lease.

The scheduler also runs a delay promoter and an outbox relay, so durable delays and jobs
published in transactions keep moving in deployments whose only long-lived process next
to the workers is beat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery import beat

from platform_tasks.jobs.points import to_ms
from platform_tasks.jobs.runtime import JobRuntime, app_name, runtime_mode, start_jobs
from platform_tasks.jobs.trigger import PointOutcome, PointResult, TriggerEngine
from platform_tasks.jobs.warm_stop import WarmStop
from platform_tasks.jobs.worker import RUN_TASK
from platform_tasks.observability.metrics_server import MetricsServer, serve
from platform_tasks.observability.scheduler_metrics import BeatMetrics
from platform_tasks.publishing.delay_promoter import Promoter, delay_promoter_for
from platform_tasks.publishing.outbox_relay import OutboxRelay, outbox_relay_for

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["LeaseScheduler"]

logger = logging.getLogger("platform_tasks.beat")

_MIN_SLEEP = 0.001
# Reconnect after a broker restart, but give up quickly: the trigger is only worth
# sending within its period (the worker's start check drops it otherwise). Applies when
# the transport cannot batch (each trigger is then published on its own).
_PUBLISH_RETRY = {
    "max_retries": 3,
    "interval_start": 0.1,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
# Redis commands per trigger in a publish batch: the message, its task-sent event and
# possibly a queue expiry; sized so a batch never flushes half-way.
_COMMANDS_PER_TRIGGER = 4


def _local_ms() -> int:
    return time.time_ns() // 1_000_000


class LeaseScheduler(beat.Scheduler):
    """Beat scheduler whose entries are the discovered jobs, admitted through Redis."""

    #: the longest beat sleeps between ticks when no point is due sooner
    max_interval = 5.0

    def __init__(self, app: PlatformCelery, *args: Any, **kwargs: Any) -> None:
        self.runtime: JobRuntime | None = None
        self.engine: TriggerEngine | None = None
        self.promoter: Promoter | None = None
        self.relay: OutboxRelay | None = None
        self._offset_ms = 0  # Redis clock minus ours (see _observe_clock)
        self._clock_seen_ms = 0
        self._unsent: dict[str, PointResult] = {}  # token -> admitted, trigger not yet sent
        self._warm_stop: WarmStop | None = None
        self._closed = False
        self._dispatching = False
        self._queues: dict[str, str] = {}  # job -> queue its triggers go to
        self.metrics_server: MetricsServer | None = None
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        super().__init__(app, *args, **kwargs)

    # -- Celery hooks ------------------------------------------------------------------

    def setup_schedule(self) -> None:
        """Validate everything before the first tick; start the delay promoter (and the
        metrics endpoint when ``PLATFORM_METRICS_PORT`` is set)."""
        settings = self.app.platform_settings
        self.runtime = start_jobs(
            settings, app_name=app_name(self.app), mode=runtime_mode(self.app), role="beat"
        )
        port = settings.metrics_port
        if port is not None:
            self.metrics_server = serve(port, role="beat")
        if self.runtime.leases is not None:
            self.engine = TriggerEngine(
                self.runtime.jobs,
                self.runtime.leases,
                owner=self.owner,
                started_at=self.runtime.ready_at,
                on_result=BeatMetrics(self.owner).observe if port is not None else None,
            )
            self._clock_seen_ms = _local_ms()
            self._offset_ms = to_ms(self.runtime.ready_at) - self._clock_seen_ms
            self._queues = {name: job.definition.queue for name, job in self.engine.jobs.items()}
        self._warm_stop = WarmStop(
            timeout_seconds=settings.beat_stop_timeout_seconds, owner=self.owner
        )
        self.promoter = delay_promoter_for(self.app, name="platform-beat-delay-promoter")
        if self.promoter is not None:
            self.promoter.start()
        self.relay = outbox_relay_for(self.app, name="platform-beat-outbox-relay")
        if self.relay is not None:
            self.relay.start()
        logger.info(
            "beat scheduler ready owner=%s ready_at_ms=%d active_jobs=%d",
            self.owner,
            to_ms(self.runtime.ready_at),
            len(self.engine.jobs) if self.engine else 0,
            extra={"event": "beat.ready"},
        )

    def now(self) -> datetime:
        """Our best estimate of the Redis clock (local clock plus the measured offset)."""
        return datetime.fromtimestamp((_local_ms() + self._offset_ms) / 1000, UTC)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Trigger every due point; return seconds until the next one (capped)."""
        if self._closed:
            # Closed by the SIGTERM/SIGINT handler, whose SystemExit a library on the
            # publish path may have turned into an ordinary error: stop the service.
            raise SystemExit()
        engine = self.engine
        if engine is None:
            return float(self.max_interval)
        batches = engine.tick_batches(self.now())
        while True:
            # A warm stop waits until this batch's admitted triggers are sent; then the
            # deferred signal's handler runs (Celery's closes and exits: nothing more
            # is admitted).
            with self._stop_deferred():
                sent_ms = _local_ms()
                batch = next(batches, None)
                if batch is None:
                    break
                admitted = [r for r in batch if r.outcome is PointOutcome.ADMITTED]
                for result in admitted:  # first: what close() gives back if cut short
                    assert result.token is not None
                    self._unsent[result.token] = result
                self._observe_clock(batch, sent_ms, _local_ms())
                if admitted:
                    self._dispatch(admitted)
            if self._closed:
                raise SystemExit()  # see above: nothing more is triggered
        next_due = engine.next_due_ms()
        if next_due is None:
            return float(self.max_interval)
        wait = (next_due - (_local_ms() + self._offset_ms)) / 1000
        return min(float(self.max_interval), max(_MIN_SLEEP, wait))

    def _stop_deferred(self) -> contextlib.AbstractContextManager[None]:
        warm_stop = self._warm_stop
        return warm_stop.deferred() if warm_stop is not None else contextlib.nullcontext()

    def _observe_clock(self, batch: Sequence[PointResult], sent_ms: int, received_ms: int) -> None:
        """Refine the Redis-minus-local clock offset from one pipeline's judged times.

        Every script ran between ``sent_ms`` and ``received_ms`` (local), so the offset
        is at least ``max(judged) - received_ms`` and at most ``min(judged) - sent_ms``.
        Reading a large pipeline's replies takes long on a busy machine, so a single
        lower bound can be far too low (it would make every later tick late by the
        read time); the estimate keeps the best lower bound seen, lets it sink by at
        most 1 ms per second (clock drift) and never exceeds the upper bound (so a
        clock step cannot make beat send points early for long).
        """
        judged = [r.judged_at_ms for r in batch if r.judged_at_ms is not None]
        if not judged:
            return
        drift_allowance = max(0, received_ms - self._clock_seen_ms) // 1000
        estimate = max(max(judged) - received_ms, self._offset_ms - drift_allowance)
        self._offset_ms = min(estimate, min(judged) - sent_ms)
        self._clock_seen_ms = received_ms

    def _dispatch(self, admitted: Sequence[PointResult]) -> None:
        """Publish the admitted triggers (already in ``_unsent``) in one batch; give
        back the leases of those that could not be sent (or whose delivery is uncertain)."""
        self._dispatching = True
        try:
            self._publish(admitted)
        finally:
            self._dispatching = False

    def _publish(self, admitted: Sequence[PointResult]) -> None:
        producer = self.producer
        # A batch fails or succeeds at its flush, so a per-message retry wrapper would
        # only cost time; without batching each trigger keeps the reconnecting retry.
        retry = not producer.supports_batch_publish
        sent: list[PointResult] = []
        failed: list[PointResult] = []
        try:
            with producer.batch(max_size=_COMMANDS_PER_TRIGGER * len(admitted) + 16):
                # Declared once per batch (cached per channel) instead of per message.
                for queue in {self._queues[r.job] for r in admitted}:
                    producer.maybe_declare(self.app.amqp.queues[queue], retry=retry)
                for result in admitted:
                    try:
                        self._send(result, producer, retry)
                    except Exception as exc:
                        failed.append(result)
                        logger.error(
                            "could not send trigger of %s: %s",
                            result.job,
                            exc,
                            extra={"event": "beat.dispatch_failed", "job": result.job},
                        )
                    else:
                        sent.append(result)
        except Exception as exc:
            # The batch flush failed: delivery of its triggers is uncertain. Releasing
            # is safe either way: a delivered trigger takes its free lease back at its
            # start check, and the marker already stops every other replica.
            logger.error(
                "could not send %d trigger(s): %s",
                len(sent),
                exc,
                extra={"event": "beat.dispatch_failed"},
            )
            failed.extend(sent)
            sent = []
        for result in sent:
            assert result.token is not None
            self._unsent.pop(result.token, None)
        if failed:
            self._release([r.token for r in failed if r.token is not None])

    def _send(self, result: PointResult, producer: Any, retry: bool) -> None:
        self.app.send_task(
            RUN_TASK,
            kwargs={
                "job": result.job,
                "point_ms": result.point_ms,
                "period_end_ms": result.period_end_ms,
                "token": result.token,
                "lease_ttl_ms": result.lease_ttl_ms,
            },
            queue=self._queues[result.job],
            producer=producer,
            declare=[],
            retry=retry,
            retry_policy=_PUBLISH_RETRY,
            # what Flower and logs show; built here instead of repr()ing the kwargs
            argsrepr="()",
            kwargsrepr=f"{{'job': {result.job!r}, 'point_ms': {result.point_ms}}}",
        )

    def _release(self, tokens: Sequence[str]) -> None:
        """Give back leases we took for triggers that were not sent (one round trip)."""
        pairs = [(self._unsent.pop(token).job, token) for token in tokens if token in self._unsent]
        if not pairs or self.runtime is None or self.runtime.leases is None:
            return
        try:
            self.runtime.leases.release_many(pairs)
        except Exception as exc:
            logger.warning(
                "lease release failed (the leases expire by themselves): %s",
                exc,
                extra={"event": "beat.release_failed"},
            )

    def sync(self) -> None:
        """Nothing to persist: Redis holds all shared state."""

    def close(self) -> None:
        """Stop triggering, give back leases of admitted points not yet sent, stop the
        promoter, close what we own (the broker connection, the Redis client we built;
        never a passed-in client). Safe to call twice (signal handler, then exit)."""
        self._closed = True
        self.engine = None
        if self._unsent:
            # A stop cut the tick short (second signal, stop timeout): these points are
            # consumed and their triggers will never be sent by anyone.
            for result in self._unsent.values():
                logger.error(
                    "trigger of %s at point_ms=%d not sent (beat stopped); its lease is "
                    "released owner=%s",
                    result.job,
                    result.point_ms,
                    self.owner,
                    extra={
                        "event": "beat.trigger_not_sent",
                        "job": result.job,
                        "point_ms": result.point_ms,
                    },
                )
            self._release(list(self._unsent))
        if self.promoter is not None:
            self.promoter.stop()
            self.promoter = None
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.runtime is not None and not self.runtime.closed:
            self.runtime.close()
            logger.info(
                "beat scheduler closed owner=%s", self.owner, extra={"event": "beat.closed"}
            )
        super().close()
        if self._dispatching:
            return  # a signal handler interrupted a publish: closed on the next call
        connection = self.__dict__.pop("connection", None)  # Celery's cached_property
        if connection is not None:
            self.__dict__.pop("producer", None)
            with contextlib.suppress(Exception):
                connection.close()

    @property
    def info(self) -> str:
        count = len(self.engine.jobs) if self.engine else 0
        return f"    . platform lease scheduler: {count} active job(s)"
