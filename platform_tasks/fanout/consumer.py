"""The fan-out consumer: one delivery of a fan-out job publishes its tenants' envelopes.

Tenants are streamed from PostgreSQL in ``tenant_id`` order (:mod:`.sources`), each gets
an envelope with a job id derived from (job, point, kind, tenant) (:mod:`.ids`), and the
envelopes go to the target queue in batches over one connection (:mod:`.publisher` on
Redis, :mod:`.amqp_publisher` with publisher confirms on RabbitMQ), each once it fits
under the queue's bound (:mod:`.backpressure`). After each batch the progress marker
(:mod:`.progress`) records the last tenant, so a delivery killed halfway is resumed by
the next one; re-publishing the one batch that was on the queue but not yet marked is
harmless, since its ids are the same.

The task is a :class:`~platform_tasks.task.PlatformTask` on ``platform.fanout``: a
fan-out that keeps failing is retried with the queue's policy, then dead-lettered, and a
replayed dead letter (same job id) resumes from the marker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from platform_tasks.brokers.selection import broker_kind
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.envelope import Envelope, parse_envelope
from platform_tasks.errors import EnvelopeError, Throttled
from platform_tasks.fanout import metrics
from platform_tasks.fanout.amqp_publisher import AmqpBatchPublisher
from platform_tasks.fanout.backpressure import RETRY_AFTER_SECONDS, QueueBound, QueueFull
from platform_tasks.fanout.completion import FanOutBatch, batch_headers, count_fan_out_ended
from platform_tasks.fanout.ids import tenant_job_id
from platform_tasks.fanout.progress import Progress, ProgressStore
from platform_tasks.fanout.publisher import BatchPublisher, TenantPublisher
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FanOutRequest
from platform_tasks.fanout.sources import Tenant, TenantSource, check_tenants_query
from platform_tasks.fanout.tiers import due_tiers
from platform_tasks.postgres.database import require_database_url
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["FanOutResult", "TenantsQueryCheckStep", "install_consumer", "run_fan_out"]

logger = logging.getLogger("platform_tasks.fanout")

PROGRESS_LOG_EVERY = 10_000
"""Tenants between two ``fanout.progress`` log lines of one delivery."""


@dataclass(frozen=True)
class FanOutResult:
    """What one delivery did: tenants published now, in total, and where it resumed."""

    published_now: int
    published_total: int
    resumed_after: str | None
    invalid: int
    already_finished: bool = False


def open_publisher(
    app: PlatformCelery,
    *,
    queue: str,
    bound: QueueBound | None = None,
    headers: Mapping[str, str] | None = None,
) -> TenantPublisher:
    """The batch publisher for ``app``'s broker: one ``LPUSH`` per batch on Redis, a
    confirmed batch on RabbitMQ (:mod:`.amqp_publisher`); each batch waits for room under
    ``bound`` first (:mod:`.backpressure`). ``headers`` go on every message."""
    if broker_kind(app.platform_settings.effective_broker_url) == "amqp":
        return AmqpBatchPublisher(app, queue=queue, bound=bound, headers=headers)
    return BatchPublisher(app, queue=queue, bound=bound, headers=headers)


def _log_fields(envelope: Envelope[Any], request: FanOutRequest) -> dict[str, Any]:
    return {
        "fanout_job_id": str(envelope.job_id),
        "job": request.job,
        "point": request.point.isoformat(),
        "kind": request.kind,
        "queue": request.queue,
    }


def run_fan_out(
    app: PlatformCelery,
    envelope: Envelope[FanOutRequest],
    *,
    settings: PlatformSettings,
    bound: QueueBound | None = None,
    tx: Any = None,
) -> FanOutResult:
    """Publish the envelopes of every selected tenant not yet published for this job.

    Each batch waits for room under ``bound`` (default: ``PLATFORM_FANOUT_MAX_QUEUE_DEPTH``
    with the standard wait); a queue that stays full raises
    :class:`~platform_tasks.errors.Throttled`, the marker kept. A fan-out with
    ``on_complete`` is a batch (:mod:`.completion`): its own ending is counted in ``tx``
    (the fan-out job's transaction) once every tenant is published.
    """
    bound = bound if bound is not None else QueueBound(settings.fanout_max_queue_depth)
    request = envelope.data
    database_url = require_database_url(settings)
    tiers = due_tiers(request.point) if request.tiers == "due" else None
    fields = _log_fields(envelope, request)
    labels = {"job": request.job, "kind": request.kind}
    started = time.monotonic()
    store = ProgressStore(database_url)
    try:
        progress = store.start(
            envelope.job_id, job=request.job, point=request.point, kind=request.kind
        )
        if progress.finished:
            _log_already_finished(envelope, progress, fields)
            metrics.RUNS.labels(outcome="already_finished", **labels).inc()
            _count_ended(app, envelope, tx)
            return FanOutResult(0, progress.published, progress.last_tenant_id, 0, True)
        _log_started(envelope, progress, tiers, fields)
        try:
            result = _publish_all(app, envelope, tiers, store, progress, settings, bound, fields)
            _count_ended(app, envelope, tx)
        except QueueFull as full:
            metrics.RUNS.labels(outcome="queue_full", **labels).inc()
            raise _paused(envelope, full, fields) from None
        except Exception:
            metrics.RUNS.labels(outcome="failed", **labels).inc()
            logger.warning(
                "fan-out %s of %s stopped; its next delivery resumes from the marker",
                envelope.job_id,
                request.job,
                extra={"event": "fanout.interrupted", **fields},
            )
            raise
        store.finish(envelope.job_id, purge_after_days=settings.processed_jobs_ttl_days)
    finally:
        store.close()
    duration = time.monotonic() - started
    metrics.DURATION.labels(**labels).observe(duration)
    metrics.RUNS.labels(outcome="finished", **labels).inc()
    _log_finished(envelope, result, duration, fields)
    return result


def _log_already_finished(
    envelope: Envelope[FanOutRequest], progress: Progress, fields: dict[str, Any]
) -> None:
    request = envelope.data
    logger.info(
        "fan-out %s of %s at %s already published %d tenant(s)",
        envelope.job_id,
        request.job,
        request.point.isoformat(),
        progress.published,
        extra={"event": "fanout.already_finished", **fields, "published": progress.published},
    )


def _log_started(
    envelope: Envelope[FanOutRequest],
    progress: Progress,
    tiers: tuple[str, ...] | None,
    fields: dict[str, Any],
) -> None:
    request = envelope.data
    resuming = progress.last_tenant_id
    logger.info(
        "fan-out %s of %s at %s to %s started%s",
        envelope.job_id,
        request.job,
        request.point.isoformat(),
        request.kind,
        f" (resuming after tenant {resuming!r})" if resuming else "",
        extra={
            "event": "fanout.started",
            **fields,
            "tiers": list(tiers or ()) or None,
            "resumed_after": resuming,
            "published_before": progress.published,
        },
    )


def _paused(
    envelope: Envelope[FanOutRequest], full: QueueFull, fields: dict[str, Any]
) -> Throttled:
    """The wait of a fan-out whose target queue stays full: it resumes at its marker."""
    logger.info(
        "fan-out %s of %s paused: queue %s holds %d message(s) (bound %d); it resumes "
        "at its marker in %.0f s",
        envelope.job_id,
        envelope.data.job,
        full.queue,
        full.depth,
        full.bound,
        RETRY_AFTER_SECONDS,
        extra={"event": "fanout.queue_full", **fields, "depth": full.depth, "bound": full.bound},
    )
    retry_at = datetime.now(UTC) + timedelta(seconds=RETRY_AFTER_SECONDS)
    return Throttled(retry_at, "fanout_queue_full")


def _log_finished(
    envelope: Envelope[FanOutRequest],
    result: FanOutResult,
    duration: float,
    fields: dict[str, Any],
) -> None:
    request = envelope.data
    logger.info(
        "fan-out %s of %s at %s published %d tenant(s) in %.2f s (%d in total)",
        envelope.job_id,
        request.job,
        request.point.isoformat(),
        result.published_now,
        duration,
        result.published_total,
        extra={
            "event": "fanout.finished",
            **fields,
            "published": result.published_now,
            "published_total": result.published_total,
            "invalid": result.invalid,
            "resumed_after": result.resumed_after,
            "duration_seconds": round(duration, 3),
        },
    )


def _count_ended(app: PlatformCelery, envelope: Envelope[FanOutRequest], tx: Any) -> None:
    """A fan-out with ``on_complete``: its own ending, in its transaction ``tx``."""
    if envelope.data.on_complete is None:
        return
    if tx is None:
        raise ValueError("a fan-out with on_complete counts its ending in its transaction (tx)")
    from platform_tasks.fanout.call import bound_port

    count_fan_out_ended(tx, envelope.job_id, lambda: bound_port(app))


def _open_batch(
    envelope: Envelope[FanOutRequest], settings: PlatformSettings
) -> FanOutBatch | None:
    """The fan-out's batch (created by its first delivery), or ``None`` without
    ``on_complete``."""
    request = envelope.data
    if request.on_complete is None:
        return None
    batch = FanOutBatch(require_database_url(settings), envelope.job_id)
    try:
        batch.ensure(
            on_complete=request.on_complete,
            profile=settings.profile,
            description=f"fan-out of {request.job} at {request.point.isoformat()} "
            f"to {request.kind}",
        )
    except BaseException:
        batch.close()
        raise
    return batch


def _publish_all(
    app: PlatformCelery,
    envelope: Envelope[FanOutRequest],
    tiers: tuple[str, ...] | None,
    store: ProgressStore,
    progress: Progress,
    settings: PlatformSettings,
    bound: QueueBound,
    fields: dict[str, Any],
) -> FanOutResult:
    request = envelope.data
    source = TenantSource(require_database_url(settings), settings.tenants_query)
    data = dict(request.data)
    data["scheduled_for"] = request.point.isoformat().replace("+00:00", "Z")
    published_now = invalid = 0
    total = progress.published
    next_log = PROGRESS_LOG_EVERY
    counter = metrics.TENANTS_PUBLISHED.labels(job=request.job, kind=request.kind)
    completion = _open_batch(envelope, settings)
    headers = batch_headers(completion.batch_id if completion is not None else None)
    try:
        publisher = open_publisher(app, queue=request.queue, bound=bound, headers=headers)
    except BaseException:
        if completion is not None:
            completion.close()
        raise
    try:
        for batch in source.stream(
            after=progress.last_tenant_id, tiers=tiers, batch_size=settings.fanout_batch_size
        ):
            envelopes, left_out = _tenant_envelopes(envelope, batch, data, settings, fields)
            invalid += left_out
            if completion is not None:  # joined (committed) before published: .completion
                completion.add(request.queue, envelopes)
            publisher.publish(envelopes)
            published_now += len(envelopes)
            total += len(envelopes)
            counter.inc(len(envelopes))
            store.save(envelope.job_id, last_tenant_id=batch[-1].tenant_id, published=total)
            if published_now >= next_log:
                next_log += PROGRESS_LOG_EVERY
                logger.info(
                    "fan-out %s: %d tenant(s) published",
                    envelope.job_id,
                    total,
                    extra={
                        "event": "fanout.progress",
                        **fields,
                        "published_total": total,
                        "last_tenant_id": batch[-1].tenant_id,
                    },
                )
    finally:
        publisher.close()
        if completion is not None:
            completion.close()
    return FanOutResult(published_now, total, progress.last_tenant_id, invalid)


def _tenant_envelopes(
    envelope: Envelope[FanOutRequest],
    batch: Sequence[Tenant],
    data: dict[str, Any],
    settings: PlatformSettings,
    fields: dict[str, Any],
) -> tuple[list[Envelope[Any]], int]:
    """The batch's envelopes, and how many tenants were left out (an id that is no valid
    envelope tenant: logged, never published)."""
    request = envelope.data
    envelopes: list[Envelope[Any]] = []
    invalid = 0
    for tenant in batch:
        payload = {
            "job_id": str(
                tenant_job_id(request.job, request.point, request.kind, tenant.tenant_id)
            ),
            "tenant_id": tenant.tenant_id,
            "correlation_id": envelope.correlation_id,
            "kind": request.kind,
            "data": data,
        }
        try:
            envelopes.append(parse_envelope(payload, dict, max_bytes=settings.max_payload_bytes))
        except EnvelopeError as exc:
            invalid += 1
            logger.error(
                "tenant %r left out of fan-out %s: %s",
                tenant.tenant_id[:128],
                envelope.job_id,
                exc,
                extra={"event": "fanout.tenant_invalid", **fields},
            )
    return envelopes, invalid


class TenantsQueryCheckStep(bootsteps.Step):
    """Worker bootstep: check the tenant source before the worker consumes anything."""

    label = "platform fan-out tenant source"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        settings: PlatformSettings = worker.app.platform_settings
        if settings.database_url:  # without it another step refuses the worker
            # every app has this step (create_app installs the fan-out): a URL it cannot
            # use is reported by the database check (password masked), whichever runs first
            require_database_url(settings)
            check_tenants_query(settings.database_url, settings.tenants_query)


def install_consumer(app: PlatformCelery, *, start_up_checks: bool = True) -> None:
    """Register the fan-out consumer task, its queue and the tenant source check.

    ``start_up_checks=False`` (what ``create_app`` installs for every app) registers the
    consumer without the worker's database and tenant-source checks: a worker of an app
    that never calls ``fan_out`` must start as it did before the consumer was added. An
    explicit ``install(app, port)`` keeps the checks. A ``PLATFORM_TENANTS_QUERY`` the
    user set says the app fans out, so its tenant source is checked either way: a query
    that cannot run refuses the worker instead of dead-lettering every fan-out.
    """
    from platform_tasks.consumer.task import PlatformTask

    settings: PlatformSettings = app.platform_settings

    def fan_out_consumer(envelope: Envelope[FanOutRequest], tx: Any) -> None:
        run_fan_out(app, envelope, settings=settings, tx=tx)

    fan_out_consumer.__doc__ = "Publish one envelope per selected tenant (platform fan-out)."
    # shared=False: the task belongs to this app alone (a shared task would be handed to
    # every app created later in the process, bound to this app's settings)
    task = app.task(base=PlatformTask, data_model=FanOutRequest, name=FANOUT_KIND, shared=False)(
        fan_out_consumer
    )
    task.start_up_checks = start_up_checks
    add_queue_source(app, lambda _app: [FANOUT_QUEUE])
    if start_up_checks or settings.tenants_query is not None:
        app.steps["worker"].add(TenantsQueryCheckStep)
