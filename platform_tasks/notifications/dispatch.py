"""From rendered messages to provider requests: tokens first, then the send, then verdicts.

:class:`Dispatcher` is where the rate limits and the provider's answers become outcomes
the consumer pipeline knows: :class:`~platform_tasks.errors.Throttled` (no token, a 429,
a quota pause, the same key in flight: run again later, no attempt spent), a permanent
error (dead letter), or an ordinary exception (retry with backoff). A rate-limit call that
Redis does not answer becomes :class:`~platform_tasks.errors.ServersUnavailable`: the
delivery waits unacked, like any of the platform's own Redis steps, and no attempt is
spent (a Redis restart must never use up a job's budget or dead-letter it).

A job's messages go out in requests of at most ``provider.max_batch``; request ``n`` of a
job always carries the ``Idempotency-Key`` ``{job_id}:{n}``, so a job run again after a
throttle, a crash or a redelivery sends the same keys with the same bodies and the
provider answers with the original ids instead of sending again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from platform_tasks.alerts import send_alert
from platform_tasks.errors import ServersUnavailable, Throttled
from platform_tasks.notifications.limiter import RateLimiter
from platform_tasks.notifications.provider import (
    Provider,
    ProviderBusy,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    RateLimitHeaders,
)
from platform_tasks.notifications.rails import MARKETING, TRANSACTIONAL
from platform_tasks.notifications.rate_limits import LEARNED_WINDOW_SECONDS
from platform_tasks.redis_client import REDIS_ERRORS

__all__ = ["WAIT_IN_PLACE_MS", "Dispatcher", "idempotency_key", "quota_reset_seconds"]

logger = logging.getLogger(__name__)

WAIT_IN_PLACE_MS = 250
"""How long in all a transactional request refused by its provider's rate may wait for
its token where it is, holding its worker slot, before it goes round the delay store.

At 48 requests/s the next token is 21 ms away; through the delay store the same receipt
came back 0.3-1.3 s later, behind the receipts published meanwhile (which take the
tokens it waited for), and was often refused again. A wait this short costs a worker slot
less than the provider request itself; waits for a tenant's bucket, after a 429 or a quota
pause, longer ones, and every marketing send still go through the delay store, so nothing
holds a worker for long and no tenant waits behind another."""


def idempotency_key(job_id: object, request_number: int) -> str:
    """The provider key of request ``request_number`` of job ``job_id``: stable across runs."""
    return f"{job_id}:{request_number}"


@contextmanager
def _rate_limits_in_redis(what: str) -> Iterator[None]:
    """Turn a Redis failure of a rate-limit call into "the servers are unavailable".

    Raised from inside the job's run, a ``redis.ConnectionError`` would otherwise be
    judged like a handler's error: a failed attempt, counted and retried, and after a
    restart that is quick enough for the count to reach Redis, a dead letter.
    """
    try:
        yield
    except REDIS_ERRORS as exc:
        raise ServersUnavailable(f"rate limits in Redis ({what}): {exc}") from exc


def quota_reset_seconds(name: str, now: datetime) -> float:
    """Seconds until a quota named ``name`` resets when the provider did not say (UTC)."""
    if name == "monthly_quota_exceeded":
        first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        reset = (first + timedelta(days=32)).replace(day=1)
    else:
        reset = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1.0, (reset - now).total_seconds())


class Dispatcher:
    """Sends a job's messages through named providers under the shared rate limits."""

    def __init__(
        self,
        limiter: RateLimiter,
        providers: Mapping[str, Callable[[], Provider]],
        *,
        clock: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        wait_in_place_ms: int = WAIT_IN_PLACE_MS,
    ) -> None:
        self.limiter = limiter
        self._factories = dict(providers)
        self._providers: dict[str, Provider] = {}
        self._clock = clock or (lambda: datetime.now(UTC))
        self._sleep = sleep
        self.wait_in_place_ms = wait_in_place_ms

    def provider(self, name: str) -> Provider:
        provider = self._providers.get(name)
        if provider is None:
            factory = self._factories.get(name)
            if factory is None:
                known = ", ".join(sorted(self._factories)) or "none"
                raise LookupError(f"no provider named {name!r} is registered (known: {known})")
            provider = self._providers[name] = factory()
        return provider

    def take_first(self, *, provider: str, rail: str, tenant_id: str, planned: int) -> None:
        """Take the tokens of a job's first request before it is rendered.

        ``planned`` is the number of messages the job will render (a blast knows it from
        its recipients): one provider request and as many tenant messages as its first
        request carries. Raises Throttled when refused, so a refused job renders nothing;
        pass ``first_taken=True`` to :meth:`send` afterwards.
        """
        adapter = self.provider(provider)
        batch = rail == MARKETING or planned > 1
        messages = min(planned, adapter.max_batch) if batch else 1
        self._take(provider, tenant_id, messages=messages, rail=rail)

    def _take(self, provider: str, tenant_id: str, *, messages: int, rail: str) -> None:
        """Take one request's tokens, or raise Throttled.

        A transactional request whose token comes within what is left of
        :data:`WAIT_IN_PLACE_MS` waits for it here and asks again.
        """
        waited = 0
        while True:
            budget = self.wait_in_place_ms - waited if rail == TRANSACTIONAL else 0
            with _rate_limits_in_redis("take"):
                decision = self.limiter.take(
                    provider, tenant_id, requests=1, messages=messages, rail=rail,
                    wait_in_place_ms=max(0, budget),
                )  # fmt: skip
            if decision.granted:
                return
            if decision.reason != "provider_rate_wait":
                raise self._throttled(decision.wait_ms / 1000, decision.reason)
            self._sleep(decision.wait_ms / 1000)
            waited += decision.wait_ms

    def send(
        self,
        *,
        provider: str,
        rail: str,
        tenant_id: str,
        job_id: object,
        messages: Sequence[Any],
        first_taken: bool = False,
    ) -> list[str]:
        """Send ``messages``; returns the provider's ids. Raises Throttled to run later.

        ``first_taken``: :meth:`take_first` already took the first request's tokens.
        """
        adapter = self.provider(provider)
        batch = rail == MARKETING or len(messages) > 1
        size = adapter.max_batch if batch else 1
        ids: list[str] = []
        for number, start in enumerate(range(0, len(messages), size)):
            chunk = list(messages[start : start + size])
            if not (first_taken and number == 0):
                self._take(provider, tenant_id, messages=len(chunk), rail=rail)
            key = idempotency_key(job_id, number)
            try:
                result = adapter.send(chunk, idempotency_key=key, batch=batch)
            except ProviderRateLimited as exc:
                with _rate_limits_in_redis("back off"):
                    self.limiter.back_off(provider, exc.retry_after)
                self._learn(provider, exc.limits)
                logger.warning(
                    "provider %s answered 429 rate_limit_exceeded; every worker waits %.1f s",
                    provider,
                    exc.retry_after,
                    extra={
                        "event": "notifications.provider_backoff",
                        "provider": provider,
                        "retry_after": exc.retry_after,
                        "tenant_id": tenant_id,
                    },
                )
                raise self._throttled(exc.retry_after, "provider_429") from None
            except ProviderQuotaExceeded as exc:
                raise self._quota(provider, exc) from None
            except ProviderBusy as exc:
                raise self._throttled(exc.retry_after, "provider_busy") from None
            self._learn(provider, result.limits)
            ids.extend(result.ids)
        return ids

    def _learn(self, provider: str, limits: RateLimitHeaders) -> None:
        if limits.limit is None:
            return
        with _rate_limits_in_redis("learn"):
            lowered = self.limiter.learn(provider, limits.limit / LEARNED_WINDOW_SECONDS)
        if lowered:
            logger.info(
                "provider %s reports a limit of %s requests/s, below the setting",
                provider,
                limits.limit,
                extra={
                    "event": "notifications.limit_learned",
                    "provider": provider,
                    "limit": limits.limit,
                },
            )

    def _quota(self, provider: str, exc: ProviderQuotaExceeded) -> Throttled:
        name = exc.name or "quota_exceeded"
        seconds = exc.reset_seconds or quota_reset_seconds(name, self._clock())
        with _rate_limits_in_redis("pause"):
            must_alert, remaining_ms = self.limiter.pause(provider, seconds, name)
        if must_alert:
            message = (
                f"provider {provider} is paused for {remaining_ms / 1000:.0f} s: {name}; "
                "notifications wait and are sent when the quota resets"
            )
            logger.error(
                message,
                extra={
                    "event": "notifications.provider_paused",
                    "provider": provider,
                    "reason": name,
                    "pause_seconds": remaining_ms / 1000,
                },
            )
            send_alert(
                message,
                tags={"provider": provider, "reason": name},
                fingerprint=["notifications.provider_paused", provider, name],
            )
        return self._throttled(remaining_ms / 1000, "provider_paused")

    def _throttled(self, seconds: float, reason: str) -> Throttled:
        return Throttled(self._clock() + timedelta(seconds=max(0.0, seconds)), reason)

    def close(self) -> None:
        for provider in self._providers.values():
            provider.close()
        self._providers.clear()
