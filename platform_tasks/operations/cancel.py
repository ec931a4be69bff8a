"""Cancel waiting jobs by tenant, kind and queue, accounting for every one.

A cancel is one ``core.operations`` row (kind ``cancel``) and does two things:

1. **A cancel rule** in ``core.cancel_rules`` (the filter, the operation id, a cutoff and
   an expiry). Every consumer checks the rules before running a job
   (:mod:`platform_tasks.consumer.cancels`): a job that matches
   and was published at or before the cutoff (the publish time its message carries in
   the ``platform_publish_time`` header; a message without one counts as published
   before) is not run; a
   ``core.dead_letters`` row records it (status ``discarded``, reason ``cancelled``,
   ``discard_reason`` ``cancelled by operation N``) in the same transaction as the job's
   idempotency row, so a redelivery of it is a duplicate. This is how queued jobs are
   cancelled on any broker (Redis lists or RabbitMQ queues): as they come up.
2. **A sweep of the delay store**: matching delayed jobs (and retries waiting there) are
   recorded the same way and removed from the store at once.

One accounting row per job (a unique index), whichever path reaches it first. A job
already running when the cancel is made sees :func:`is_cancelled` turn true and may stop
cooperatively. Jobs published after the cancel are not affected.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg2.extensions import connection as Connection

from platform_tasks.batches.endings import PortFactory
from platform_tasks.brokers.delay_location import delay_store_location
from platform_tasks.consumer.cancels import (
    RULES_MAX_AGE_SECONDS,
    Rule,
    current_job,
    read_rules,
    record_cancelled,
)
from platform_tasks.headers import UNIQUE_HEADER
from platform_tasks.limits.unique import UniqueLocks
from platform_tasks.observability.trace_context import publish_time_of
from platform_tasks.operations.filters import JobFilter
from platform_tasks.operations.log import (
    Operation,
    connect,
    default_actor,
    fetch_operation,
    finish_operation,
    start_operation,
)
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "DEFAULT_RULE_TTL",
    "PROPAGATION_SECONDS",
    "CancelPreview",
    "CancelResult",
    "CancelRule",
    "cancel_jobs",
    "cancel_rules",
    "is_cancelled",
    "lift_cancel",
    "preview_cancel",
]

logger = logging.getLogger(__name__)

DEFAULT_RULE_TTL = timedelta(days=1)
"""How long a cancel rule keeps cancelling queued jobs as they come up."""

PROPAGATION_SECONDS = RULES_MAX_AGE_SECONDS * 2
"""How long :func:`cancel_jobs` waits after writing its rule: every consumer has read the
rules again by then, so none starts a matching job after the cancel returned."""

SWEEP_BATCH = 500
"""Delay-store entries read per ``HSCAN`` round trip and recorded per transaction."""

CancelRule = Rule
"""A cancel in force: jobs matching ``filter`` published at or before ``cutoff`` are not
run until ``expires_at`` (``operation_id``, ``filter``, ``cutoff``, ``expires_at``)."""


@dataclass(frozen=True)
class CancelPreview:
    """What a cancel would reach now: matching entries of the delay store, and the depth
    of the queues whose waiting jobs the rule would check (``None``: unreadable)."""

    delayed: int
    queue_depths: dict[str, int | None]


@dataclass(frozen=True)
class CancelResult:
    operation: Operation
    delayed_cancelled: int
    rule: CancelRule


@dataclass(frozen=True)
class _Delayed:
    """One delay-store entry, read as the job it will become."""

    entry_id: str
    queue: str | None
    envelope: dict[str, Any]
    published: float | None = None
    """The publish time the stored message carries (``None``: none, counts as before)."""
    unique_key: str | None = None
    """The unique publish key the job holds, released when the job is cancelled."""


def _delay_stores(settings: PlatformSettings) -> list[tuple[Any, Any]]:
    """``(client, keys)`` of the delay store this deployment uses (none: native delays)."""
    location = delay_store_location(settings)
    return [] if location is None else [(location.connect(), location.keys)]


def _body_envelope(body: Any, encoding: str | None) -> dict[str, Any] | None:
    if isinstance(body, str) and encoding == "base64":
        body = base64.b64decode(body).decode("utf-8", "replace")
    decoded = json.loads(body) if isinstance(body, str | bytes) else body
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], list) and decoded[0]:
        first = decoded[0][0]  # protocol 2: [args, kwargs, embed]; the envelope is args[0]
        if isinstance(first, dict):
            return first
    return None


def decode_entry(entry_id: str, raw: bytes | str, key_prefix: str = "") -> _Delayed | None:
    """A delay-store entry (Redis-list or AMQP encoding) as its queue, envelope and
    publish time, or ``None`` when it holds no readable envelope (left alone).
    ``key_prefix`` is the broker's ``global_keyprefix``, taken off a Redis list's name
    to give the queue's."""
    try:
        data = json.loads(raw)
        if "m" in data:  # {"q": list key, "m": kombu wire message}
            message = json.loads(data["m"])
            encoding = (message.get("properties") or {}).get("body_encoding")
            envelope = _body_envelope(message.get("body"), encoding)
            headers = message.get("headers")
            list_name = str(data["q"]).split("\x06\x16")[0]
            if key_prefix and list_name.startswith(key_prefix):
                list_name = list_name[len(key_prefix) :]
            queue: str | None = list_name
        else:  # AMQP message: {"q", "e", "r", "b", "p"}
            envelope = _body_envelope(data.get("b"), None)
            headers = (data.get("p") or {}).get("application_headers")
            queue = str(data.get("q") or "") or None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None
    if envelope is None:
        return None
    if not isinstance(headers, dict):
        headers = {}
    unique = headers.get(UNIQUE_HEADER)
    return _Delayed(
        entry_id,
        queue,
        envelope,
        publish_time_of(headers),
        unique if isinstance(unique, str) and unique else None,
    )


def _matching_delayed(
    client: Any, keys: Any, where: JobFilter, key_prefix: str = ""
) -> Iterator[list[_Delayed]]:
    """Batches of delay-store entries matching ``where`` (an ``HSCAN``: entries added or
    promoted meanwhile may be seen or not; the cancel rule covers those)."""
    batch: list[_Delayed] = []
    for entry_id, raw in client.hscan_iter(keys.entries, count=SWEEP_BATCH):
        entry_text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        delayed = decode_entry(entry_text, raw, key_prefix)
        if delayed is None:
            continue
        envelope = delayed.envelope
        if where.matches(
            tenant_id=envelope.get("tenant_id"), kind=envelope.get("kind"), queue=delayed.queue
        ):
            batch.append(delayed)
            if len(batch) >= SWEEP_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _key_prefix(app: PlatformCelery | None) -> str:
    """The broker's ``global_keyprefix`` (kombu puts it before every Redis list name)."""
    if app is None:
        return ""
    options = app.conf.broker_transport_options or {}
    return str(options.get("global_keyprefix") or "")


def preview_cancel(
    settings: PlatformSettings,
    where: JobFilter,
    *,
    queues: list[str] | None = None,
    app: PlatformCelery | None = None,
) -> CancelPreview:
    """Count matching delay-store entries (a scan; nothing changes) and read the depth of
    ``queues`` (default: ``where.queue`` if set, else none). Needs the broker settings
    (and the platform Redis for a RabbitMQ delay store); ``app`` gives the broker's key
    prefix, when it sets one."""
    delayed = 0
    prefix = _key_prefix(app)
    for client, keys in _delay_stores(settings):
        try:
            delayed += sum(len(batch) for batch in _matching_delayed(client, keys, where, prefix))
        finally:
            client.close()
    names = list(queues) if queues is not None else ([where.queue] if where.queue else [])
    from platform_tasks.operations.pause import broker_depths

    return CancelPreview(delayed, broker_depths(settings, names, app=app) if names else {})


def cancel_jobs(
    settings: PlatformSettings,
    where: JobFilter,
    *,
    actor: str | None = None,
    rule_ttl: timedelta = DEFAULT_RULE_TTL,
    conn: Connection | None = None,
    now: datetime | None = None,
    app: PlatformCelery | None = None,
) -> CancelResult:
    """Cancel every waiting job matching ``where``: record the operation, set the rule
    (consumers stop running matching queued jobs), sweep the delay store.

    The operation's ``done`` counts every job accounted for so far; queued jobs are
    added as consumers reach them. Rerunning a cancel is harmless (each job has one row).
    Returns after :data:`PROPAGATION_SECONDS`, when every consumer has read the rule.
    ``now`` is ignored (the cutoff is the platform Redis's ``TIME``, the clock publish
    times are on; PostgreSQL's when that Redis is unreadable). Needs ``settings.database_url``
    and the broker settings (and ``settings.redis_url`` for a RabbitMQ delay store);
    ``app`` gives the broker's key prefix (``global_keyprefix``), when it sets one.
    """
    if rule_ttl <= timedelta(0):
        raise ValueError(f"rule_ttl must be positive, got {rule_ttl}")
    who = actor or default_actor()
    with connect(settings, conn) as db:
        with db, db.cursor() as cur:
            operation = start_operation(cur, kind="cancel", actor=who, filter=where.to_json())
            rule = _insert_rule(cur, operation, where, settings, rule_ttl)
        logger.info(
            "operation %s (cancel) started by %s on %s",
            operation.id,
            who,
            where.describe(),
            extra={
                "event": "operations.started",
                "operation_id": operation.id,
                "kind": "cancel",
                "actor": who,
                "filter": where.to_json(),
            },
        )
        operation, delayed = _sweep_and_finish(db, settings, where, rule, operation, app)
    logger.info(
        "operation %s (cancel): %d delayed job(s) cancelled; rule in force until %s",
        operation.id,
        delayed,
        rule.expires_at.isoformat(),
        extra={
            "event": "operations.finished",
            "operation_id": operation.id,
            "kind": "cancel",
            "outcome": operation.outcome,
            "done": operation.done,
        },
    )
    return CancelResult(operation, delayed, rule)


def _insert_rule(
    cur: Any,
    operation: Operation,
    where: JobFilter,
    settings: PlatformSettings,
    rule_ttl: timedelta,
) -> Rule:
    """Store the cancel rule consumers read, in the operation's transaction, so a rule
    never exists without its operation; expired rules are pruned on the way."""
    cur.execute(
        "INSERT INTO core.cancel_rules (operation_id, tenant_id, kind, queue, cutoff, "
        "expires_at) VALUES (%s, %s, %s, %s, COALESCE(to_timestamp(%s), now()), "
        "now() + %s) RETURNING cutoff, expires_at",
        (
            operation.id,
            where.tenant_id,
            where.kind,
            where.queue,
            _reference_now(settings),
            rule_ttl,
        ),
    )
    row = cur.fetchone()
    assert row is not None
    rule = Rule(operation.id, where, row[0], row[1])
    cur.execute("DELETE FROM core.cancel_rules WHERE expires_at <= now()")
    return rule


def _sweep_and_finish(
    db: Connection,
    settings: PlatformSettings,
    where: JobFilter,
    rule: Rule,
    operation: Operation,
    app: PlatformCelery | None,
) -> tuple[Operation, int]:
    """Sweep every delay store, wait until consumers have read the rule, then finish the
    operation; any failure (even an interrupt) marks it failed so it never stays running.
    Returns the finished operation and how many delayed jobs were cancelled."""
    started = time.monotonic()
    delayed = 0
    try:
        for client, keys in _delay_stores(settings):
            try:
                delayed += _sweep(
                    db, client, keys, where, rule, _key_prefix(app), _callback_port(settings, app)
                )
            finally:
                client.close()
        left = PROPAGATION_SECONDS - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)  # consumers' rule caches expire (see PROPAGATION_SECONDS)
        with db, db.cursor() as cur:
            operation = finish_operation(
                cur,
                operation.id,
                outcome="succeeded",
                detail=f"{delayed} delayed job(s) cancelled now; queued jobs are "
                f"cancelled as consumers reach them until {rule.expires_at.isoformat()}",
            )
    except BaseException as exc:
        db.rollback()
        with db, db.cursor() as cur:
            finish_operation(
                cur, operation.id, outcome="failed", detail=f"{type(exc).__name__}: {exc}"
            )
        raise
    return operation, delayed


def _callback_port(settings: PlatformSettings, app: PlatformCelery | None) -> PortFactory:
    """The port that publishes a batch's callbacks when the sweep ends its last child."""
    from platform_tasks.app import platform_queue_port
    from platform_tasks.publishing.queue_port import QueuePort

    return lambda: QueuePort(app) if app is not None else platform_queue_port(settings)


def _reference_now(settings: PlatformSettings) -> float | None:
    """The cutoff on the clock publish times are on (the platform Redis's ``TIME``, see
    :mod:`~platform_tasks.publishing.reference_clock`); ``None`` (PostgreSQL's clock)
    when that Redis cannot be read."""
    from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
    from platform_tasks.publishing.reference_clock import redis_time

    client = build_redis(settings, timeout=2.0)
    try:
        return redis_time(client)
    except REDIS_ERRORS as exc:
        logger.warning(
            "the cancel's cutoff is PostgreSQL's clock: the platform Redis's TIME is "
            "unreadable (%s)",
            type(exc).__name__,
            extra={"event": "operations.cutoff_clock_fallback"},
        )
        return None
    finally:
        client.close()


def _sweep(
    db: Connection, client: Any, keys: Any, where: JobFilter, rule: Rule, key_prefix: str, port: Any
) -> int:
    """Record then remove the matching delay-store entries; how many were recorded.

    The row is committed before the entry is removed, so a crash in between leaves an
    accounted job still in the store (a rerun, or the rule when it is promoted, finds
    its row and adds none), never a removed job without a row.
    """
    from platform_tasks.publishing.delay_store import DelayStore

    store = DelayStore(client, keys)
    locks: UniqueLocks | None = None
    cancelled = 0
    for batch in _matching_delayed(client, keys, where, key_prefix):
        eligible = [
            item
            for item in batch
            if rule.matches(
                published=item.published,
                tenant_id=item.envelope.get("tenant_id"),
                kind=item.envelope.get("kind"),
                queue=item.queue,
            )
        ]
        with db, db.cursor() as cur:
            for item in eligible:
                envelope = item.envelope
                row = record_cancelled(
                    cur,
                    rule.operation_id,
                    job_id=envelope.get("job_id"),
                    queue=item.queue,
                    kind=envelope.get("kind"),
                    tenant_id=envelope.get("tenant_id"),
                    correlation_id=envelope.get("correlation_id"),
                    payload=envelope,
                    attempts=0,
                    where="delayed",
                    port=port,
                )
                cancelled += row is not None
        store.remove([item.entry_id for item in eligible])
        store.forget_returns([item.entry_id for item in eligible])
        for item in eligible:  # a cancelled job never starts: its unique key is free
            if item.unique_key is not None:
                locks = locks or UniqueLocks(client, keys)
                locks.release(item.unique_key, str(item.envelope.get("job_id")))
    return cancelled


def cancel_rules(settings: PlatformSettings, *, conn: Connection | None = None) -> list[CancelRule]:
    """The cancel rules in force (expired ones are left out). Needs ``settings.database_url``."""
    with connect(settings, conn) as db, db, db.cursor() as cur:
        return read_rules(cur)


def lift_cancel(
    settings: PlatformSettings, operation_id: int, *, conn: Connection | None = None
) -> bool:
    """Remove the rule of cancel ``operation_id`` before it expires; jobs already cancelled
    stay cancelled. ``False`` when no such rule was in force."""
    with connect(settings, conn) as db, db, db.cursor() as cur:
        cur.execute(
            "DELETE FROM core.cancel_rules WHERE operation_id = %s RETURNING 1", (operation_id,)
        )
        lifted = cur.fetchone() is not None
        if lifted:
            found = fetch_operation(cur, operation_id)
            note = f"{found.detail or ''} (rule lifted)".strip() if found else None
            cur.execute(
                "UPDATE core.operations SET detail = %s WHERE id = %s", (note, operation_id)
            )
    logger.info(
        "cancel rule of operation %s %s",
        operation_id,
        "lifted" if lifted else "was not in force",
        extra={"event": "operations.cancel_lifted", "operation_id": operation_id, "lifted": lifted},
    )
    return lifted


def is_cancelled() -> bool:
    """Inside a running job: whether a cancel made after it started now matches it.

    Cooperative: a long handler calls this between units of work and stops (raising or
    returning) when true. Outside a job it is ``False``. Reads the rules (through the
    job's own transaction) at most every quarter second; while that transaction is
    aborted it answers from the rules last read.
    """
    job = current_job.get()
    if job is None:
        return False
    from psycopg2.extensions import TRANSACTION_STATUS_INTRANS

    rules = job.check.cached()
    conn = getattr(job.cursor, "connection", None)
    if (
        conn is not None
        and not conn.closed
        and not job.cursor.closed
        and (conn.info.transaction_status == TRANSACTION_STATUS_INTRANS)
    ):
        rules = job.check.rules(job.cursor)
    return any(
        rule.matches(
            published=job.published, tenant_id=job.tenant_id, kind=job.kind, queue=job.queue
        )
        for rule in rules
    )
