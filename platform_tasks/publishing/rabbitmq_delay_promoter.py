"""Promote due delay-store entries into RabbitMQ, removing each only after its confirm.

With ``PLATFORM_RABBITMQ_DELAYS=delay_store`` delayed jobs and retries wait in the
platform's Redis as finished AMQP messages. Redis and RabbitMQ share no transaction, so the
hand-off cannot be atomic the way it is onto a Redis broker's list; it is at least once:

1. claim due entries under a lease (``claim_delays.lua``: the entry stays stored, its due
   time moves to the lease's end, so no other promoter takes it meanwhile);
2. publish them on a confirm-mode channel and collect RabbitMQ's confirms;
3. remove the confirmed entries (``remove_delays.lua``); unconfirmed ones are released
   to be due again at once.

Confirms are awaited in steps of :data:`CONFIRM_WAIT_FRACTION` of the claim lease, the
lease renewed after each step, so a slow confirm (a broker blocking publishers under a
memory alarm) never lets the lease end and a second promoter claim and publish the entry
again while the first still waits.

A message RabbitMQ returns (``mandatory``: no queue is bound for it, e.g. its queue was
deleted) is not released at once, which would publish it again in a tight loop: its entry
is postponed with a doubling back-off (the count of returns per entry lives in Redis, so it
survives restarts and is shared by promoters), and after :data:`MAX_RETURNS` returns it is
dead-lettered into ``core.dead_letters`` with an alert and removed from the store.

A claimed entry is marked claimed until removed (``keys.claimed``): a debounce publish
(``unique_schedule.lua``) would otherwise overwrite data this pass already published and
then see its own removed with the entry; it stores a new job instead.

A promoter killed between 2 and 3 leaves its entries to be claimed again when the lease
ends: the job is published twice and the consumer's idempotency row absorbs the second
copy. A promoter that loses RabbitMQ leaves its entries stored and retries with back-off.

:class:`RabbitMQPromotion` is this pass; :class:`RabbitMQDelayPromoter` runs it in the one
promotion loop every broker shares
(:class:`~platform_tasks.publishing.promotion_loop.PromotionLoop`: thread, back-off,
logging), so every worker (and beat replica) runs one, like the promoter onto a Redis broker.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from platform_tasks.brokers.delay_location import DelayStoreLocation
from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import raw_payload
from platform_tasks.errors import BrokerPublishError
from platform_tasks.observability.scheduler_metrics import delay_promoted
from platform_tasks.postgres.database import Database, require_database_url
from platform_tasks.publishing.amqp_wire import AmqpMessage
from platform_tasks.publishing.confirmed_publisher import ConfirmedPublisher
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.promotion_loop import PassLog, PromotionLoop, wait_until_next_due
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)

AfterConfirm = Callable[[list[str]], None]
"""Called with the ids of confirmed entries before they are removed (a seam for fault
tests that stop a promoter exactly there); the default does nothing."""

CONFIRM_WAIT_FRACTION = 1 / 3
"""Confirms are awaited at most this fraction of the claim lease: a batch's publishes and
its confirms then end well before another promoter may claim its entries."""

MAX_CONFIRM_LEASES = 20
"""A batch whose confirms are slow keeps its claim (renewed every third of a lease) for at
most this many leases; then it is released and published again (at least once)."""

MAX_RETURNS = 5
"""Returns (unroutable) after which a delayed message is dead-lettered, not published again."""

RETURN_BACKOFF_SECONDS = 1.0
"""Back-off after the first return; it doubles with each further return (1, 2, 4, 8 s)."""

UNROUTABLE_DELAYED = "unroutable_delayed"
"""``reason`` of the dead letter of a delayed message RabbitMQ kept returning."""

PROMOTION_ERRORS: tuple[type[Exception], ...] = (BrokerPublishError, *REDIS_ERRORS)
"""Failures the loop outlives: RabbitMQ or Redis unreachable, retried with back-off."""


class RabbitMQPromotion:
    """The promotion pass into RabbitMQ: claim due entries, publish them with confirms,
    remove the confirmed ones (steps 1 to 3 above), until nothing more is due."""

    log = PassLog(
        logger,
        promoted="published delayed jobs to RabbitMQ",
        failed="delay promotion to RabbitMQ failed (%s); retrying",
        failed_unexpectedly="delay promotion to RabbitMQ failed unexpectedly; retrying",
    )
    expected_errors = PROMOTION_ERRORS

    def __init__(
        self,
        app: PlatformCelery,
        *,
        after_confirm: AfterConfirm | None = None,
        return_backoff_seconds: float = RETURN_BACKOFF_SECONDS,
        stopping: threading.Event | None = None,
    ) -> None:
        self.app = app
        self.settings: PlatformSettings = app.platform_settings
        self.after_confirm = after_confirm
        self.return_backoff_seconds = return_backoff_seconds
        self.stopping = stopping if stopping is not None else threading.Event()
        self._client: Any = None  # a Redis or RedisCluster client, as build_redis makes it
        self._store: DelayStore | None = None
        self._publisher: ConfirmedPublisher | None = None
        self._database: Database | None = None

    @property
    def interval(self) -> float:
        return self.settings.delay_poll_interval_seconds

    @property
    def lease_ms(self) -> int:
        return int(self.settings.delay_lease_seconds * 1000)

    @property
    def confirm_timeout(self) -> float:
        """Seconds to wait for a batch's confirms: a fraction of the claim lease."""
        return self.settings.delay_lease_seconds * CONFIRM_WAIT_FRACTION

    def publisher(self) -> ConfirmedPublisher:
        """A publisher whose confirm wait fits well inside the claim lease."""
        return ConfirmedPublisher(self.app, confirm_timeout=self.confirm_timeout)

    def open(self) -> None:
        """Connect to the platform's Redis (the store) and prepare the publisher; RabbitMQ
        is reached at the first pass, so an unreachable broker is a retried failure."""
        location = DelayStoreLocation.for_rabbitmq(self.settings)
        self._client = location.connect(timeout=10, connect_timeout=5)
        self._store = DelayStore(self._client, location.keys)
        self._publisher = self.publisher()

    def run_pass(self) -> tuple[int, float]:
        if self._store is None or self._publisher is None:
            raise RuntimeError("RabbitMQPromotion.run_pass before open()")
        return self.publish_due(self._store, self._publisher)

    def close(self) -> None:
        publisher, self._publisher = self._publisher, None
        client, self._client, self._store = self._client, None, None
        database, self._database = self._database, None
        if publisher is not None:
            publisher.close()
        if client is not None:
            client.close()
        if database is not None:
            database.close()

    def publish_due(self, store: DelayStore, publisher: ConfirmedPublisher) -> tuple[int, float]:
        """Publish everything due; return entries moved and seconds until the next is due."""
        interval = self.interval
        moved = 0
        wait = interval
        while not self.stopping.is_set():
            publisher.ensure_connected()  # before claiming: a dead broker strands nothing
            claim = store.claim_due(self.settings.delay_batch_size, self.lease_ms)
            wait = min(wait, wait_until_next_due(claim.next_due_in_ms, interval))
            if not claim.entries:
                break
            ids = [entry_id for entry_id, _ in claim.entries]
            try:
                confirmed = publisher.publish(
                    [AmqpMessage.decode(raw) for _, raw in claim.entries],
                    renew=self._renewer(store, ids),
                )
            except BrokerPublishError:
                store.release(ids)  # due again at once; the back-off paces the retry
                raise
            done = [entry_id for entry_id, ok in zip(ids, confirmed, strict=True) if ok]
            returned = [(ids[i], claim.entries[i][1]) for i in sorted(publisher.returned)]
            returned_ids = {entry_id for entry_id, _ in returned}
            failed = [
                entry_id
                for entry_id, ok in zip(ids, confirmed, strict=True)
                if not ok and entry_id not in returned_ids
            ]
            if done and self.after_confirm is not None:
                self.after_confirm(done)
            store.remove(done)
            store.forget_returns(done)
            for entry_id, raw in returned:
                self._handle_return(store, entry_id, raw)
            if failed:
                store.release(failed)
                logger.warning(
                    "%d delayed jobs were not confirmed by RabbitMQ; retrying",
                    len(failed),
                    extra={"event": "delay.publish_unconfirmed"},
                )
            moved += len(done)
            if done:
                delay_promoted(len(done))
            if failed or returned or not claim.more_due:
                break
        return moved, wait

    def _renewer(self, store: DelayStore, ids: list[str]) -> Callable[[], bool]:
        """Renew the batch's lease while its confirms are awaited, up to
        :data:`MAX_CONFIRM_LEASES` leases; then the wait ends and the batch is released."""
        started = time.monotonic()

        def renew() -> bool:
            if self.stopping.is_set():
                return False
            if time.monotonic() - started > MAX_CONFIRM_LEASES * self.settings.delay_lease_seconds:
                return False
            store.extend(ids, self.lease_ms)
            logger.warning(
                "RabbitMQ has not confirmed %d delayed jobs yet; lease renewed",
                len(ids),
                extra={"event": "delay.confirm_slow"},
            )
            return True

        return renew

    def _handle_return(self, store: DelayStore, entry_id: str, raw: bytes) -> None:
        """Back off on a returned entry, or dead-letter it after :data:`MAX_RETURNS`."""
        returns = store.record_return(
            entry_id, int(self.return_backoff_seconds * 1000), MAX_RETURNS
        )
        if returns < MAX_RETURNS:
            delay = self.return_backoff_seconds * 2 ** (returns - 1)
            logger.warning(
                "RabbitMQ returned delayed job %s as unroutable (%d of %d); retrying in %.1fs",
                entry_id,
                returns,
                MAX_RETURNS,
                delay,
                extra={
                    "event": "delay.publish_returned_backoff",
                    "entry_id": entry_id,
                    "returns": returns,
                    "delay_seconds": delay,
                },
            )
            return
        message = AmqpMessage.decode(raw)
        record = unroutable_delayed_record(message, returns)
        database = self._dead_letter_database()
        try:
            conn = database.connection()
            with conn.cursor() as cur:
                dead_letter_id = record.write(cur)
            conn.commit()
        except BaseException:
            database.discard()
            raise  # the entry stays leased and comes back: nothing is lost
        store.remove([entry_id])
        store.forget_returns([entry_id])
        record.alert(dead_letter_id)
        logger.error(
            "delayed job %s was returned %d times as unroutable; dead-lettered as row %s",
            entry_id,
            returns,
            dead_letter_id,
            extra={
                "event": "delay.dead_lettered_unroutable",
                "entry_id": entry_id,
                "dead_letter_id": dead_letter_id,
                "queue": record.queue,
            },
        )

    def _dead_letter_database(self) -> Database:
        if self._database is None:
            self._database = Database(require_database_url(self.settings))
        return self._database


class RabbitMQDelayPromoter(PromotionLoop[RabbitMQPromotion]):
    """The promotion loop running :class:`RabbitMQPromotion`: a background thread that
    publishes due entries to RabbitMQ until stopped."""

    def __init__(
        self,
        app: PlatformCelery,
        *,
        name: str = "platform-rabbitmq-delay-promoter",
        after_confirm: AfterConfirm | None = None,
        return_backoff_seconds: float = RETURN_BACKOFF_SECONDS,
    ) -> None:
        super().__init__(
            RabbitMQPromotion(
                app, after_confirm=after_confirm, return_backoff_seconds=return_backoff_seconds
            ),
            name=name,
        )
        self.app = app
        self.settings: PlatformSettings = app.platform_settings

    def publisher(self) -> ConfirmedPublisher:
        """See :meth:`RabbitMQPromotion.publisher`."""
        return self.promotion.publisher()

    def run_once(self, store: DelayStore, publisher: ConfirmedPublisher) -> tuple[int, float]:
        """One pass over ``store`` with ``publisher`` (see :meth:`RabbitMQPromotion.publish_due`),
        for callers that hold their own store and publisher."""
        return self.promotion.publish_due(store, publisher)


def unroutable_delayed_record(message: AmqpMessage, returns: int) -> DeadLetter:
    """The dead letter of a delayed message RabbitMQ returned ``returns`` times."""
    headers = message.properties.get("application_headers") or {}
    headers = dict(headers) if isinstance(headers, dict) else {}
    task_id = headers.get("id") or message.properties.get("correlation_id")
    try:
        job_id = uuid.UUID(str(task_id)) if task_id else None
    except ValueError:
        job_id = None
    kind = headers.get("task")
    return DeadLetter(
        job_id=job_id,
        queue=message.queue or message.routing_key or None,
        kind=kind if isinstance(kind, str) else None,
        tenant_id=None,
        correlation_id=None,
        payload=raw_payload(message.body.encode(), message.properties.get("content_type"), headers),
        attempts=0,
        last_error=(
            f"{UNROUTABLE_DELAYED}: RabbitMQ returned the delayed message {returns} times: "
            f"no queue is bound for exchange {message.exchange!r} with routing key "
            f"{message.routing_key!r} (queue deleted?)"
        ),
        error_type=UNROUTABLE_DELAYED,
        reason=UNROUTABLE_DELAYED,
    )
