"""When PostgreSQL or Redis cannot do their part, and how a delivery waits for them.

One tuple, :data:`INFRASTRUCTURE_ERRORS`, says which errors of the platform's *own* calls
(the claim, the delivery count, storing a retry, writing a dead letter) mean "the servers
are unavailable" rather than "this job is wrong". Redis error replies count too: a
server at ``maxmemory`` under ``noeviction`` answers ``OOM``, a replica ``READONLY``, a
server that cannot persist ``MISCONF``; the job must wait for them like for a disconnect,
never be acked without a retry or a dead letter. Errors raised by a handler are judged
separately (only a lost PostgreSQL connection makes the job wait).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg2

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.errors import ServersUnavailable
from platform_tasks.postgres.database import DatabaseUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")

INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    ServersUnavailable,
    DatabaseUnavailable,
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    *REDIS_ERRORS,  # a Redis Cluster none of whose nodes answers raises no RedisError
)
"""Errors of the platform's own server calls after which a delivery waits and starts over."""

FIRST_WAIT_SECONDS = 0.25
LONGEST_WAIT_SECONDS = 5.0


def describe(exc: BaseException) -> str:
    """A short text for the waiting log line: the error's type and first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Backoff:
    """Growing pauses between tries while a server is unavailable (``sleep`` is the seam)."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self.sleep = sleep
        self.delay = FIRST_WAIT_SECONDS

    def wait(self, cause: str, *, outage: bool = True) -> None:
        """Pause before the next try; ``outage`` false logs a failed step, not an outage
        (a programming error must never read as "database or Redis unavailable")."""
        if outage:
            logger.warning(
                "database or Redis unavailable (%s); waiting",
                cause,
                extra={"event": "consumer.waiting_for_servers", "cause": cause},
            )
        else:
            logger.error(
                "a consumer step failed (%s); waiting before trying again",
                cause,
                extra={"event": "consumer.waiting_after_error", "cause": cause},
            )
        self.sleep(self.delay)
        self.delay = min(self.delay * 2, LONGEST_WAIT_SECONDS)


def until_done(step: Callable[[], T], what: str, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``step`` until it succeeds; the message stays unacked meanwhile.

    For the steps that must happen before a message may be acked (storing a retry,
    writing a dead letter): *any* exception is waited out, because giving up would ack a
    job that is neither retried nor dead-lettered.
    """
    backoff = Backoff(sleep)
    while True:
        try:
            return step()
        except Exception as exc:
            if not isinstance(exc, INFRASTRUCTURE_ERRORS):
                logger.error(
                    "could not %s (%s); trying again",
                    what,
                    describe(exc),
                    exc_info=True,
                    extra={"event": "consumer.settle_failed", "step": what},
                )
            backoff.wait(f"{what}: {describe(exc)}", outage=isinstance(exc, INFRASTRUCTURE_ERRORS))
