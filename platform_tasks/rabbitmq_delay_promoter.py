"""Promote due delay-store entries into RabbitMQ, removing each only after its confirm.

With ``PLATFORM_RABBITMQ_DELAYS=delay_store`` delayed jobs and retries wait in the
platform's Redis as finished AMQP messages. Redis and RabbitMQ share no transaction, so the
hand-off cannot be atomic the way it is onto a Redis broker's list; it is at least once:

1. claim due entries under a lease (``claim_delays.lua``: the entry stays stored, its due
   time moves to the lease's end, so no other promoter takes it meanwhile);
2. publish them on a confirm-mode channel and collect RabbitMQ's confirms;
3. remove the confirmed entries (``remove_delays.lua``); unconfirmed ones are released
   to be due again at once.

A promoter killed between 2 and 3 leaves its entries to be claimed again when the lease
ends: the job is published twice and the consumer's idempotency row absorbs the second
copy. A promoter that loses RabbitMQ leaves its entries stored and retries with back-off.
Every worker (and beat replica) runs one, like the promoter onto a Redis broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from platform_tasks.amqp_wire import AmqpMessage
from platform_tasks.confirmed_publisher import ConfirmedPublisher
from platform_tasks.delay_store import DelayStore
from platform_tasks.errors import BrokerPublishError
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.scheduler_metrics import delay_promoted
from platform_tasks.settings import PlatformSettings

logger = logging.getLogger(__name__)

AfterConfirm = Callable[[list[str]], None]
"""Called with the ids of confirmed entries before they are removed (a seam for fault
tests that stop a promoter exactly there); the default does nothing."""

MIN_WAIT_SECONDS = 0.005

PROMOTION_ERRORS: tuple[type[Exception], ...] = (BrokerPublishError, *REDIS_ERRORS)
"""Failures the loop outlives: RabbitMQ or Redis unreachable, retried with back-off."""


class RabbitMQDelayPromoter:
    """A background thread that publishes due entries to RabbitMQ until stopped."""

    def __init__(
        self,
        app: Any,
        *,
        name: str = "platform-rabbitmq-delay-promoter",
        after_confirm: AfterConfirm | None = None,
    ) -> None:
        self.app = app
        self.settings: PlatformSettings = app.platform_settings
        self.name = name
        self.after_confirm = after_confirm
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.moved_total = 0

    @property
    def lease_ms(self) -> int:
        return int(self.settings.delay_lease_seconds * 1000)

    def run_once(self, store: DelayStore, publisher: ConfirmedPublisher) -> tuple[int, float]:
        """Publish everything due; return entries moved and seconds until the next is due."""
        moved = 0
        wait = self.settings.delay_poll_interval_seconds
        while not self._stop.is_set():
            publisher.ensure_connected()  # before claiming: a dead broker strands nothing
            claim = store.claim_due(self.settings.delay_batch_size, self.lease_ms)
            if claim.next_due_in_ms is not None:
                wait = min(wait, max(MIN_WAIT_SECONDS, claim.next_due_in_ms / 1000))
            if not claim.entries:
                break
            ids = [entry_id for entry_id, _ in claim.entries]
            try:
                confirmed = publisher.publish([AmqpMessage.decode(raw) for _, raw in claim.entries])
            except BrokerPublishError:
                store.release(ids)  # due again at once; the back-off paces the retry
                raise
            done = [entry_id for entry_id, ok in zip(ids, confirmed, strict=True) if ok]
            failed = [entry_id for entry_id, ok in zip(ids, confirmed, strict=True) if not ok]
            if done and self.after_confirm is not None:
                self.after_confirm(done)
            store.remove(done)
            if failed:
                store.release(failed)
                logger.warning(
                    "%d delayed jobs were not confirmed by RabbitMQ; retrying", len(failed),
                    extra={"event": "delay.publish_unconfirmed"},
                )  # fmt: skip
            moved += len(done)
            if done:
                delay_promoted(len(done))
            if failed or not claim.more_due:
                break
        return moved, wait

    def _loop(self) -> None:
        client = build_redis(self.settings, timeout=10, connect_timeout=5)
        store = DelayStore(client, rabbitmq_delay_keys(self.settings.profile))
        publisher = ConfirmedPublisher(self.app)
        interval = self.settings.delay_poll_interval_seconds
        failures = 0
        try:
            while not self._stop.is_set():
                wait = interval
                try:
                    moved, wait = self.run_once(store, publisher)
                    failures = 0
                    if moved:
                        self.moved_total += moved
                        logger.debug("published delayed jobs to RabbitMQ",
                                     extra={"event": "delay.promoted", "count": moved})  # fmt: skip
                except PROMOTION_ERRORS as exc:
                    failures += 1
                    logger.warning(
                        "delay promotion to RabbitMQ failed (%s); retrying", exc,
                        extra={"event": "delay.promote_failed"},
                    )  # fmt: skip
                except Exception:  # the promoter must outlive any surprise; entries stay
                    failures += 1
                    logger.exception("delay promotion to RabbitMQ failed unexpectedly; retrying",
                                     extra={"event": "delay.promote_failed"})  # fmt: skip
                if failures:
                    wait = min(30.0, interval * 2 ** min(failures, 6))
                self._stop.wait(wait)
        finally:
            publisher.close()
            client.close()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
