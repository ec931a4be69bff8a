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

The depths and waits are read by a thread of the step's own
(:mod:`platform_tasks.notifications.yield_reader`); the event loop acts on the newest
reading and never waits for the broker or Redis, so a server that hangs cannot hold the
loop that dispatches and acknowledges every queue's deliveries. What the yield does while
a server does not answer is written there: it keeps marketing as it is while the depth is
unreadable, and keeps the last wait Redis answered while Redis is unreadable.

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
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from prometheus_client import Counter

from platform_tasks.consumer.queue_gate import hold, release
from platform_tasks.notifications.rails import MARKETING, TRANSACTIONAL, notification_queue
from platform_tasks.notifications.yield_reader import Reading, Watched, YieldReader, broker_depth

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

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
"""How often the transactional depth is read (one broker round trip per channel) and the
event loop acts on the newest reading."""

YIELD_REASON = "marketing yield"
"""The yield's hold on a marketing queue (:mod:`platform_tasks.consumer.queue_gate`):
an operator's pause of the same queue outlasts the yield's resume, and the other way."""

REFRESH_TIMEOUT_SECONDS = 10.0
"""How long :meth:`MarketingYield.check` waits for a fresh look (never the event loop)."""

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


def _marketing_providers(app: PlatformCelery, channel: str) -> tuple[str, ...]:
    """Providers of the app's marketing NotificationTasks on ``channel``."""
    names = {
        getattr(task, "provider", None)
        for task in app.tasks.values()
        if getattr(task, "rail", None) == MARKETING and getattr(task, "channel", None) == channel
    }
    return tuple(sorted(name for name in names if isinstance(name, str)))


class MarketingYield(bootsteps.StartStopStep):
    """Consumer bootstep: cancel/re-add marketing consumers by transactional depth."""

    label = "notification marketing yield"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.states: dict[str, YieldState] = {}  # marketing queue → state, kept across restarts
        self.reader: YieldReader | None = None
        self._timer: Any = None
        self._acted_on = 0

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
        watched = {
            marketing: Watched(
                notification_queue(state.channel, TRANSACTIONAL, channels=[state.channel]),
                state.providers,
            )
            for marketing, state in self.states.items()
        }
        self.reader = YieldReader(c.app, settings, watched, interval=CHECK_INTERVAL_SECONDS).start()
        self._acted_on = 0
        self._timer = c.timer.call_repeatedly(CHECK_INTERVAL_SECONDS, self.tick, (c,), priority=10)

    def tick(self, c: Any) -> None:
        """Act on the newest reading not acted on yet (the event loop; never waits)."""
        reading = self.reader.latest if self.reader is not None else None
        if reading is not None and reading.number > self._acted_on:
            self.act(c, reading)

    def check(self, c: Any) -> None:
        """One fresh look, waited for, then acted on: for callers that may wait (tests,
        tools). The worker's timer calls :meth:`tick` instead."""
        if self.reader is None:
            return
        reading = self.reader.refresh(REFRESH_TIMEOUT_SECONDS)
        if reading is not None:
            self.act(c, reading)

    def act(self, c: Any, reading: Reading) -> None:
        """Pause or resume each watched marketing queue by ``reading``."""
        self._acted_on = reading.number
        if reading.depths is None:  # broker away: keep the current state
            return
        for marketing, depth in reading.depths.items():
            state = self.states[marketing]
            waiting = reading.waits.get(marketing, 0.0)
            action = state.decide(depth, waiting)
            if action == "pause":
                state.paused_at = time.monotonic()
                c.call_soon(hold, c, marketing, YIELD_REASON)
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
                c.call_soon(release, c, marketing, YIELD_REASON)
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

    def stop(self, c: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.reader is not None:
            self.reader.stop()
            self.reader = None

    shutdown = stop
