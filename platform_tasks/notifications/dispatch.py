"""From rendered messages to provider requests: tokens first, then the send, then verdicts.

:class:`Dispatcher` is where the rate limits and the provider's answers become outcomes
the consumer pipeline knows: :class:`~platform_tasks.errors.Throttled` (no token, a 429,
a quota pause, the same key in flight: run again later, no attempt spent), a permanent
error (dead letter), or an ordinary exception (retry with backoff). A rate-limit call that
Redis does not answer becomes :class:`~platform_tasks.errors.ServersUnavailable`: the
delivery waits unacked, like any of the platform's own Redis steps, and no attempt is
spent (a Redis restart must never use up a job's budget or dead-letter it).

A job's messages go out in requests of at most ``provider.max_batch``; request ``n`` of a
job always carries the ``Idempotency-Key`` ``{job_id}:{n}``. Each request is noted in the
job's :mod:`send record <platform_tasks.notifications.send_records>` before it leaves and
again once answered, so a job run again after a throttle, a crash or a redelivery resumes
at its first unanswered request; one tried but not answered is sent again under the same
key with the same body (the provider answers with the original ids) while the provider
still knows the key, and dead-lettered rather than sent blind once it may not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.errors import PermanentError, ServersUnavailable, Throttled
from platform_tasks.notifications.limiter import RateLimiter
from platform_tasks.notifications.message import EmailMessage
from platform_tasks.notifications.provider import (
    Provider,
    ProviderBusy,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    RateLimitHeaders,
    SendResult,
)
from platform_tasks.notifications.rails import MARKETING, TRANSACTIONAL
from platform_tasks.notifications.send_records import (
    KEY_TRUSTED_MS,
    SendProgress,
    SendRecords,
    decode_plan,
    encode_plan,
)
from platform_tasks.observability.alerts import send_alert
from platform_tasks.settings.rate_limits import LEARNED_WINDOW_SECONDS

__all__ = [
    "LONGEST_TENANT_WAIT_SECONDS",
    "WAIT_IN_PLACE_MS",
    "Dispatcher",
    "Rejection",
    "SendOutcome",
    "idempotency_key",
    "quota_reset_seconds",
]

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


LONGEST_TENANT_WAIT_SECONDS = 24 * 3600
"""The longest a job may need its tenant's bucket for: a job of more messages than the
tenant's limit lets through in a day is refused (a dead letter naming
``PLATFORM_TENANT_RATE_LIMITS``), not sent a request at a time for days."""


CLOCK_SKEW_WARNING_SECONDS = 5.0
"""A worker clock further than this from Redis's is worth a warning (once per process)."""


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


@dataclass(frozen=True)
class Rejection:
    """An email of a job the provider refused while it sent the rest of its request."""

    index: int
    """Its place among the job's messages."""
    recipients: list[str]
    message: str

    def describe(self) -> str:
        return f"email {self.index} ({', '.join(self.recipients) or '?'}): {self.message}"


@dataclass
class SendOutcome:
    """What a job's send did: the provider's ids of the emails sent, those it refused."""

    ids: list[str] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)

    def add(self, result: SendResult, chunk: Sequence[Any], start: int) -> None:
        """Add one request's answer; ``start`` is the job index of the chunk's first email."""
        self.ids.extend(result.ids)
        for item in result.rejected:
            message = chunk[item.index] if 0 <= item.index < len(chunk) else None
            self.rejected.append(Rejection(start + item.index, _recipients(message), item.message))


def _recipients(message: Any) -> list[str]:
    """The ``to`` addresses of a message (an EmailMessage or an adapter's own shape)."""
    to = message.to if isinstance(message, EmailMessage) else None
    if to is None and isinstance(message, Mapping):
        to = message.get("to")
    if isinstance(to, str):
        return [to]
    return [str(t) for t in to] if isinstance(to, Sequence) else []


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
        records: SendRecords | None = None,
    ) -> None:
        self.limiter = limiter
        self.records = records or SendRecords(limiter.client, profile=limiter.profile)
        self._factories = dict(providers)
        self._providers: dict[str, Provider] = {}
        self._clock = clock or (lambda: datetime.now(UTC))
        """This worker's clock: only compared with Redis's, to warn when it is off."""
        self._skew_reported = False
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

    def progress(self, job_id: object) -> SendProgress:
        """What earlier runs of ``job_id`` sent (its send record), read from Redis."""
        with _rate_limits_in_redis("read the send record"):
            return self.records.progress(job_id)

    def take_first(
        self,
        *,
        provider: str,
        rail: str,
        tenant_id: str,
        planned: int,
        progress: SendProgress | None = None,
    ) -> bool:
        """Take the tokens of a job's first request before it is rendered.

        ``planned`` is the number of messages the job will render (a blast knows it from
        its recipients): one provider request and as many tenant messages as its first
        request carries. Raises Throttled when refused, so a refused job renders nothing;
        pass ``first_taken=True`` to :meth:`send` afterwards. A job that an earlier run
        already started (``progress``) takes nothing here: its next request is not its
        first. Returns whether tokens were taken.
        """
        adapter = self.provider(provider)
        self._refuse_unfit(provider, planned)
        if progress is not None and progress.resumed:
            return False
        batch = rail == MARKETING or planned > 1
        messages = min(planned, adapter.max_batch) if batch else 1
        self._take(provider, tenant_id, messages=messages, rail=rail)
        return True

    def _refuse_unfit(self, provider: str, messages: int) -> None:
        """A job its tenant's bucket would let through only after more than a day: refuse.

        Such a job would hold its recipients back for days, a request at a time; an
        operator fixes it by raising the tenant's limit or splitting the job, so it is a
        dead letter that says so, not a job that waits for days.
        """
        limit = self.limiter.tenant_limits.get(provider)
        if limit is None:
            return
        seconds = (messages - limit.capacity) / limit.per_second
        if seconds > LONGEST_TENANT_WAIT_SECONDS:
            raise PermanentError(
                f"a job of {messages} {provider} messages needs {seconds / 3600:.0f} h of its "
                f"tenant's bucket (PLATFORM_TENANT_RATE_LIMITS: {provider}={limit}); jobs "
                f"may need at most {LONGEST_TENANT_WAIT_SECONDS // 3600} h: raise the "
                "tenant limit or send fewer messages per job"
            )

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
                    provider,
                    tenant_id,
                    requests=1,
                    messages=messages,
                    rail=rail,
                    wait_in_place_ms=max(0, budget),
                )
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
        progress: SendProgress | None = None,
    ) -> SendOutcome:
        """Send ``messages``; returns the provider's ids and the emails it refused one by
        one. Raises Throttled to run later.

        Requests an earlier run of the job had answered are not sent again (their ids come
        from the send record); a job of several requests sends what it rendered when it
        first sent (the record's plan), whatever its render returns now.
        ``first_taken``: :meth:`take_first` already took the next request's tokens.
        """
        adapter = self.provider(provider)
        if progress is None:
            progress = self.progress(job_id)
        messages = self._planned(job_id, messages, progress)
        self._refuse_unfit(provider, len(messages))
        batch = rail == MARKETING or len(messages) > 1
        size = adapter.max_batch if batch else 1
        chunks = [list(messages[start : start + size]) for start in range(0, len(messages), size)]
        plan = encode_plan(messages) if len(chunks) > 1 and progress.plan is None else None
        taken = first_taken
        outcome = SendOutcome()
        for number, chunk in enumerate(chunks):
            answered = progress.done.get(number)
            if answered is not None:
                outcome.add(answered, chunk, number * size)
                continue
            tried = progress.started.get(number)
            if tried is not None and progress.now_ms - tried > KEY_TRUSTED_MS:
                raise self._outcome_unknown(provider, job_id, number, progress.now_ms - tried)
            if not taken:
                self._take(provider, tenant_id, messages=len(chunk), rail=rail)
            taken = False
            with _rate_limits_in_redis("write the send record"):
                self.records.start(job_id, number, plan)
            plan = None
            result = self._request(adapter, provider, tenant_id, chunk, job_id, number, batch)
            with _rate_limits_in_redis("write the send record"):
                self.records.sent(job_id, number, result, last=number == len(chunks) - 1)
            outcome.add(result, chunk, number * size)
        return outcome

    def _planned(
        self, job_id: object, messages: Sequence[Any], progress: SendProgress
    ) -> Sequence[Any]:
        """The messages to send: the record's plan when an earlier run stored one."""
        if progress.plan is None:
            return messages
        planned = decode_plan(progress.plan)
        if encode_plan(messages) != progress.plan:
            logger.warning(
                "job %s rendered other messages than when it first sent; the rest of the "
                "first rendering is sent",
                job_id,
                extra={"event": "notifications.render_changed", "job_id": str(job_id)},
            )
        return planned

    def _outcome_unknown(
        self, provider: str, job_id: object, number: int, age_ms: int
    ) -> PermanentError:
        """Request ``number`` was tried ``age_ms`` ago and never answered; its key is stale.

        The provider may have sent it (an answer lost to a timeout) and no longer knows its
        key, so trying again could deliver it twice. The job is dead-lettered saying so;
        the try is dropped from the record, so replaying the dead letter sends it.
        """
        with _rate_limits_in_redis("write the send record"):
            self.records.forget_try(job_id, number)
        logger.error(
            "job %s: request %s to %s was tried %.1f h ago and never answered",
            job_id,
            number,
            provider,
            age_ms / 3_600_000,
            extra={
                "event": "notifications.outcome_unknown",
                "job_id": str(job_id),
                "provider": provider,
                "request": number,
            },
        )
        return PermanentError(
            f"request {number} of this job was tried {age_ms / 3_600_000:.1f} h ago and "
            f"never answered: {provider} may have sent it and no longer knows its "
            f"Idempotency-Key ({KEY_TRUSTED_MS // 3_600_000} h), so it is not sent again "
            "blind; check the provider's log, and replay this dead letter to send it"
        )

    def _request(
        self,
        adapter: Provider,
        provider: str,
        tenant_id: str,
        chunk: list[Any],
        job_id: object,
        number: int,
        batch: bool,
    ) -> SendResult:
        """Send one request under its key; the provider's "not now" answers as Throttled."""
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
        return result

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
        seconds = exc.reset_seconds or quota_reset_seconds(name, self._now())
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
        """Run again ``seconds`` after now by the buckets' clock (Redis ``TIME``).

        The waits come from the buckets and the delay store promotes by Redis ``TIME``:
        a due time from this worker's clock, 30 s behind, made a job refused for 3 s due
        27 s ago, promoted at once and refused again, round and round.
        """
        return Throttled(self._now() + timedelta(seconds=max(0.0, seconds)), reason)

    def _now(self) -> datetime:
        """The buckets' time; warns once per process when this worker's clock is far off."""
        with _rate_limits_in_redis("time"):
            now = datetime.fromtimestamp(self.limiter.now_ms() / 1000, UTC)
        skew = (self._clock() - now).total_seconds()
        if abs(skew) > CLOCK_SKEW_WARNING_SECONDS and not self._skew_reported:
            self._skew_reported = True
            logger.warning(
                "this worker's clock is %.1f s %s Redis's; notification due times use Redis's",
                abs(skew),
                "ahead of" if skew > 0 else "behind",
                extra={"event": "notifications.clock_skew", "skew_seconds": skew},
            )
        return now

    def close(self) -> None:
        for provider in self._providers.values():
            provider.close()
        self._providers.clear()
