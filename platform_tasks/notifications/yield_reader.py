"""What the marketing yield judges by, read off the worker's event loop.

The yield decides on the consumer's event loop, the loop that also dispatches deliveries,
acknowledges them and sends heartbeats for every queue. Its inputs come from two servers:
the transactional depth from the broker, and how long refused transactional sends wait
for provider tokens from the platform's Redis. A server that hangs (a stopped process
whose port still accepts, a silent network cut) held that loop for the whole socket
timeout on every tick: 3.7-5 s of every 0.5 s while the platform's Redis was frozen.

So a :class:`YieldReader` thread does the reading, one look every
:data:`~platform_tasks.notifications.marketing_yield.CHECK_INTERVAL_SECONDS`, and keeps
the last :class:`Reading`; the loop only acts on the newest reading it has not acted on
yet, and never waits for one.

While a server does not answer:

- broker unreadable: the reading has no depths and the yield keeps marketing as it is
  (the look fails after one connection attempt and is tried again the next interval);
- platform Redis unreadable: the yield keeps the **last wait it read** for each channel
  (0 s if Redis never answered since the worker started) and goes on judging the depth.
  While Redis is away no send of either rail gets a token, so the wait cannot change;
  a marketing consumer paused for a long transactional wait stays paused until Redis
  answers again. Each Redis look has :data:`REDIS_TIMEOUT_SECONDS` and one attempt, and
  after a failure Redis is asked again only every :data:`REDIS_RETRY_SECONDS`, so the
  depth stays fresh meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "ONE_ATTEMPT",
    "REDIS_RETRY_SECONDS",
    "REDIS_TIMEOUT_SECONDS",
    "Reading",
    "Watched",
    "YieldReader",
    "broker_depth",
]

logger = logging.getLogger(__name__)

ONE_ATTEMPT = {"max_retries": 0}
"""kombu transport option of the depth connection: a broker that is away fails the look at
once (the next look tries again) instead of following kombu's reconnect schedule."""

REDIS_TIMEOUT_SECONDS = 1.0
"""Connect and read timeout of the reader's Redis client (one attempt, no retries)."""

REDIS_RETRY_SECONDS = 5.0
"""After a failed Redis look, how long the reader leaves Redis alone (depths go on)."""


def broker_depth(channel: Any, queue: str) -> int:
    """Messages waiting in ``queue``, asked of the broker.

    Virtual transports (Redis) count every priority list of the queue (``_size``: one
    pipelined ``LLEN`` each); AMQP brokers answer a passive ``queue.declare``. A queue
    that does not exist yet holds nothing.
    """
    size = getattr(channel, "_size", None)
    if size is not None:
        return int(size(queue))
    from kombu.exceptions import ChannelError

    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except ChannelError:
        return 0


@dataclass(frozen=True)
class Watched:
    """One marketing queue the yield watches: its channel's transactional queue, and the
    providers of the app's marketing tasks on that channel (whose buckets hold the wait)."""

    transactional_queue: str
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reading:
    """One look. ``depths`` (marketing queue → transactional depth) is ``None`` when the
    broker did not answer; ``waits`` (marketing queue → seconds) holds the last wait Redis
    answered for each queue. ``number`` counts the reader's looks, from 1."""

    number: int
    depths: Mapping[str, int] | None
    waits: Mapping[str, float] = field(default_factory=dict)


class YieldReader:
    """A daemon thread that reads depths and waits every ``interval`` seconds.

    It owns its broker connection and Redis client; nothing else touches them.
    :meth:`refresh` asks for a look now and waits for it (bounded), for callers that
    may wait; the event loop reads :attr:`latest` only.
    """

    def __init__(
        self,
        app: PlatformCelery,
        settings: PlatformSettings,
        watched: Mapping[str, Watched],
        *,
        interval: float,
    ) -> None:
        self._app = app
        self._settings = settings
        self._watched = dict(watched)
        self._interval = interval
        self._cond = threading.Condition()
        self._requested = 0
        self._looks = 0
        self._looking = False
        self._stopping = False
        self._latest: Reading | None = None
        self._thread: threading.Thread | None = None
        self._connection: Any = None
        self._redis: Any = None
        self._redis_retry_at = 0.0
        self._waits: dict[str, float] = {}
        self.broker_failing = False
        self.redis_failing = False

    @property
    def latest(self) -> Reading | None:
        """The newest reading (``None`` before the first look ends); never waits."""
        return self._latest

    def start(self) -> YieldReader:
        self._thread = threading.Thread(
            target=self._run, name="platform-marketing-yield-reader", daemon=True
        )
        self._thread.start()
        return self

    def refresh(self, timeout: float) -> Reading | None:
        """A look that starts after this call, waited for up to ``timeout`` seconds."""
        with self._cond:
            self._requested += 1
            # a look under way may have read before this call: wait for the one after it
            wanted = self._looks + (2 if self._looking else 1)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._looks >= wanted or self._stopping, timeout)
            return self._latest

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; it closes its own connections when its current look ends."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        return
                    self._looking = True
                    served = self._requested
                try:
                    depths, waits = self._look()
                except Exception:  # never let the thread die: the yield would go blind
                    logger.exception(
                        "marketing yield look failed",
                        extra={"event": "notifications.yield_look_failed"},
                    )
                    depths, waits = None, dict(self._waits)
                with self._cond:
                    self._looking = False
                    self._looks += 1
                    self._latest = Reading(self._looks, depths, waits)
                    self._cond.notify_all()
                    self._cond.wait_for(partial(self._asked_since, served), self._interval)
        finally:
            self._close()

    def _asked_since(self, served: int) -> bool:
        """Stop, or a :meth:`refresh` came after the look that served ``served`` began."""
        return self._stopping or self._requested > served

    def _look(self) -> tuple[dict[str, int] | None, dict[str, float]]:
        depths = self._read_depths()
        self._read_waits()
        return depths, dict(self._waits)

    def _read_depths(self) -> dict[str, int] | None:
        try:
            if self._connection is None:
                self._connection = self._app.connection_for_read(transport_options=ONE_ATTEMPT)
            channel = self._connection.default_channel
            depths = {
                marketing: broker_depth(channel, watched.transactional_queue)
                for marketing, watched in self._watched.items()
            }
        except Exception as exc:  # broker away: no depths this look, try again next one
            if not self.broker_failing:
                logger.warning(
                    "transactional depth unreadable (%s); marketing unchanged",
                    type(exc).__name__,
                    extra={"event": "notifications.depth_unreadable"},
                )
            self.broker_failing = True
            self._reset_connection()
            return None
        self.broker_failing = False
        return depths

    def _read_waits(self) -> None:
        """Update the wait of every watched queue whose channel has marketing providers."""
        providers = sorted({p for w in self._watched.values() for p in w.providers})
        if not providers or time.monotonic() < self._redis_retry_at:
            return
        from platform_tasks.brokers.redis_client import build_redis
        from platform_tasks.keys import rate_limit_keys

        try:
            if self._redis is None:  # a RedisCluster connects right here
                self._redis = build_redis(
                    self._settings, timeout=REDIS_TIMEOUT_SECONDS, single_attempt=True
                )
            now_ms = redis_now_ms(self._redis)
            slots = {
                p: self._redis.hget(rate_limit_keys(self._settings.profile, p).bucket, "next_t")
                for p in providers
            }
        except Exception as exc:  # Redis away: keep the last waits (see the module doc)
            self._redis_retry_at = time.monotonic() + REDIS_RETRY_SECONDS
            if not self.redis_failing:
                logger.warning(
                    "transactional wait unreadable (%s); the yield keeps the last wait it "
                    "read and judges the depth",
                    type(exc).__name__,
                    extra={"event": "notifications.wait_unreadable"},
                )
            self.redis_failing = True
            return
        self.redis_failing = False
        for marketing, watched in self._watched.items():
            ahead = [
                float(slot) - now_ms
                for slot in (slots[p] for p in watched.providers)
                if slot is not None
            ]
            self._waits[marketing] = max([0.0, *ahead]) / 1000

    def _reset_connection(self) -> None:
        if self._connection is None:
            return
        try:
            self._connection.release()
        except Exception:
            logger.debug(
                "could not release the depth connection",
                exc_info=True,
                extra={"event": "notifications.depth_connection_release_failed"},
            )
        self._connection = None

    def _close(self) -> None:
        self._reset_connection()
        if self._redis is not None:
            try:
                self._redis.close()
            except Exception:
                logger.debug(
                    "could not close the wait client",
                    exc_info=True,
                    extra={"event": "notifications.wait_client_close_failed"},
                )
            self._redis = None
