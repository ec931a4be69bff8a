"""Marketing yields to transactional: a worker bootstep that pauses marketing consumers.

In every worker that consumes (or consumed, before a pause) a channel's marketing queue,
this step reads the depth of the same channel's transactional queue *from the broker*
every :data:`CHECK_INTERVAL_SECONDS` and, with hysteresis, cancels the marketing consumer
above ``PLATFORM_MARKETING_PAUSE_DEPTH`` and adds it back below
``PLATFORM_MARKETING_RESUME_DEPTH``. It also cancels it while transactional sends the
provider bucket refused are waiting for tokens more than
:data:`TRANSACTIONAL_WAIT_PAUSE_SECONDS` ahead (and adds it back below
:data:`TRANSACTIONAL_WAIT_RESUME_SECONDS`). Marketing's own refused sends never pause it:
while transactional is quiet, marketing is what keeps the provider at its limit.
It uses the same calls as Celery's
``cancel_consumer``/``add_consumer`` control commands, on the consumer's own event loop.

A pause only stops fetching: messages already taken finish and are acked as usual,
nothing is requeued or redelivered for it. A worker that consumes only marketing watches
the transactional depth all the same (the depth is the broker's, not the worker's).
Pauses and resumes are logged (``notifications.marketing_paused`` /
``notifications.marketing_resumed``) and counted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from celery import bootsteps
from prometheus_client import Counter

from platform_tasks.notifications.rails import MARKETING, TRANSACTIONAL, notification_queue

__all__ = [
    "CHECK_INTERVAL_SECONDS",
    "TRANSACTIONAL_WAIT_PAUSE_SECONDS",
    "TRANSACTIONAL_WAIT_RESUME_SECONDS",
    "MarketingYield",
    "YieldState",
    "broker_depth",
]

logger = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 0.5
"""How often the transactional depth is read: one broker round trip per channel."""

ONE_ATTEMPT = {"max_retries": 0}
"""kombu transport option of the depth connection: a broker that is away fails the look at
once (the next tick looks again) instead of retrying on the event loop."""

PAUSES = Counter(
    "platform_marketing_pauses",
    "Marketing consumers paused for transactional depth.",
    ("channel",),
)
RESUMES = Counter("platform_marketing_resumes", "Marketing consumers resumed.", ("channel",))
PAUSED_SECONDS = Counter(
    "platform_marketing_paused_seconds",
    "Seconds marketing consumers spent paused.",
    ("channel",),
)


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


TRANSACTIONAL_WAIT_PAUSE_SECONDS = 1.0
"""Marketing stops fetching while transactional sends refused by a provider bucket hold
slots this far ahead (``next_t`` of the bucket): transactional is then short of tokens,
and the marketing sends that take the spare ones are what it waits behind. Judged on
transactional's queue, not marketing's: a marketing backlog at the provider is the normal
state of a blast and says nothing about whether transactional needs the capacity."""

TRANSACTIONAL_WAIT_RESUME_SECONDS = 0.25


@dataclass
class YieldState:
    """Hysteresis of one channel: paused above ``pause_depth`` (or while refused
    transactional sends wait more than :data:`TRANSACTIONAL_WAIT_PAUSE_SECONDS` for
    provider tokens), resumed once the depth is below ``resume_depth`` and the wait below
    :data:`TRANSACTIONAL_WAIT_RESUME_SECONDS`."""

    channel: str
    pause_depth: int
    resume_depth: int
    providers: tuple[str, ...] = ()
    paused_at: float | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def decide(self, depth: int, transactional_wait: float = 0.0) -> str | None:
        """``"pause"``, ``"resume"`` or ``None`` (pure; the step acts on it)."""
        if not self.paused and (
            depth > self.pause_depth or transactional_wait > TRANSACTIONAL_WAIT_PAUSE_SECONDS
        ):
            return "pause"
        if (
            self.paused
            and depth < self.resume_depth
            and transactional_wait < TRANSACTIONAL_WAIT_RESUME_SECONDS
        ):
            return "resume"
        return None


def _marketing_providers(app: Any, channel: str) -> tuple[str, ...]:
    """Providers of the app's marketing NotificationTasks on ``channel``."""
    names = {
        getattr(task, "provider", None)
        for task in app.tasks.values()
        if getattr(task, "rail", None) == MARKETING and getattr(task, "channel", None) == channel
    }
    return tuple(sorted(name for name in names if isinstance(name, str)))


class MarketingYield(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: cancel/re-add marketing consumers by transactional depth."""

    label = "notification marketing yield"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.states: dict[str, YieldState] = {}  # marketing queue → state, kept across restarts
        self._timer: Any = None
        self._connection: Any = None
        self._failing = False
        self._limits: Any = None
        self._profile = ""

    def start(self, c: Any) -> None:
        settings = c.app.platform_settings
        consumed = set(c.app.amqp.queues.consume_from)
        channels = list(settings.notification_channels)
        for channel in channels:
            marketing = notification_queue(channel, MARKETING, channels=channels)
            state = self.states.get(marketing)
            if state is None and marketing in consumed:
                self.states[marketing] = YieldState(
                    channel,
                    settings.marketing_pause_depth,
                    settings.marketing_resume_depth,
                    providers=_marketing_providers(c.app, channel),
                )
            elif state is not None and state.paused and marketing in consumed:
                # the consumer restarted (broker reconnect) with marketing selected again
                c.call_soon(c.cancel_task_queue, marketing)
        if not self.states:
            return
        # One connection attempt per look: the check runs on the consumer's event loop, and
        # kombu's default reconnect schedule held that loop for 6 s on every tick of an
        # outage (acks, results and the consumer's own reconnect waited behind it).
        self._connection = c.app.connection_for_read(transport_options=ONE_ATTEMPT)
        if self._limits is None and any(state.providers for state in self.states.values()):
            from platform_tasks.redis_client import build_redis

            self._limits = build_redis(settings)
            self._profile = settings.profile
        self._timer = c.timer.call_repeatedly(CHECK_INTERVAL_SECONDS, self.check, (c,), priority=10)

    def check(self, c: Any) -> None:
        """One look at every watched channel (runs on the consumer's event loop)."""
        try:
            channel = self._connection.default_channel
            depths = {
                marketing: broker_depth(
                    channel,
                    notification_queue(state.channel, TRANSACTIONAL, channels=[state.channel]),
                )
                for marketing, state in self.states.items()
            }
        except Exception as exc:  # broker away: keep the current state, look again later
            if not self._failing:
                logger.warning(
                    "transactional depth unreadable (%s); marketing unchanged",
                    type(exc).__name__,
                    extra={"event": "notifications.depth_unreadable"},
                )
            self._failing = True
            self._reset_connection()
            return
        self._failing = False
        for marketing, depth in depths.items():
            state = self.states[marketing]
            waiting = self._transactional_wait(state)
            action = state.decide(depth, waiting)
            if action == "pause":
                state.paused_at = time.monotonic()
                c.call_soon(c.cancel_task_queue, marketing)
                PAUSES.labels(state.channel).inc()
                logger.info(
                    "marketing paused on %s: transactional depth %d (pause above %d), "
                    "%.1f s of transactional sends waiting for provider tokens",
                    state.channel,
                    depth,
                    state.pause_depth,
                    waiting,
                    extra={
                        "event": "notifications.marketing_paused",
                        "channel": state.channel,
                        "queue": marketing,
                        "depth": depth,
                        "transactional_wait_seconds": round(waiting, 3),
                    },
                )
            elif action == "resume":
                assert state.paused_at is not None
                paused_for = time.monotonic() - state.paused_at
                state.paused_at = None
                c.call_soon(c.add_task_queue, marketing)
                RESUMES.labels(state.channel).inc()
                PAUSED_SECONDS.labels(state.channel).inc(paused_for)
                logger.info(
                    "marketing resumed on %s after %.1f s: transactional depth %d < %d",
                    state.channel,
                    paused_for,
                    depth,
                    state.resume_depth,
                    extra={
                        "event": "notifications.marketing_resumed",
                        "channel": state.channel,
                        "queue": marketing,
                        "depth": depth,
                        "paused_seconds": round(paused_for, 3),
                    },
                )

    def _transactional_wait(self, state: YieldState) -> float:
        """Seconds of transactional slots the channel's provider buckets already handed out
        to refused sends (0: no transactional send is waiting for a token)."""
        if not state.providers or self._limits is None:
            return 0.0
        from platform_tasks.keys import rate_limit_keys

        try:
            seconds, micros = self._limits.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            slots = [
                self._limits.hget(rate_limit_keys(self._profile, p).bucket, "next_t")
                for p in state.providers
            ]
        except Exception:  # Redis away: sends wait on their own; judge by depth alone
            return 0.0
        ahead = [float(slot) - now_ms for slot in slots if slot is not None]
        return max([0.0, *ahead]) / 1000

    def _reset_connection(self) -> None:
        try:
            self._connection.release()
        except Exception:
            logger.debug(
                "could not release the depth connection",
                exc_info=True,
                extra={"event": "notifications.depth_connection_release_failed"},
            )
        self._connection = self._connection.clone()

    def stop(self, c: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._connection is not None:
            self._connection.release()
            self._connection = None
        if self._limits is not None:
            self._limits.close()
            self._limits = None

    shutdown = stop
