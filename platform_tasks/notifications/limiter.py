"""Token buckets in Redis shared by every worker: per provider (requests) and per tenant.

One script call takes from both buckets or from neither (:meth:`RateLimiter.take`), so a
refused tenant never spends a provider request and a refused provider request never spends
tenant messages. A provider's keys share one hash tag, so the scripts also run on Redis
Cluster. Time is Redis ``TIME`` unless a clock is injected (tests drive it explicitly).

What a provider says back is shared too: a 429 ``rate_limit_exceeded`` empties the
provider's bucket until ``retry-after`` (:meth:`back_off`) so every worker backs off, not
just the one refused; ``ratelimit-limit`` below the setting lowers the rate
(:meth:`learn`); a quota 429 pauses the provider (:meth:`pause`), alerting once.

Redis errors are not caught here: a limiter that cannot ask Redis must not send (fail
closed). The dispatcher turns them into ``ServersUnavailable``, on which the consumer
waits with the job unacked and no attempt spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from redis.exceptions import NoScriptError

from platform_tasks.brokers.scripts import script_source
from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.keys import RateLimitKeys, rate_limit_keys
from platform_tasks.settings.rate_limits import RateLimit

__all__ = [
    "LEARNED_RATE_TTL_MS",
    "MARKETING_HEADROOM",
    "TRANSACTIONAL_QUIET_MS",
    "Decision",
    "RateLimiter",
]

LEARNED_RATE_TTL_MS = 3_600_000
"""A rate learned from the provider's headers holds for an hour, then the setting applies
again (and is lowered again if the provider still says so): a raised account limit is
picked up without a restart."""

MARKETING_HEADROOM = 0.2
"""Share of a provider bucket marketing sends leave for transactional ones (at least one
token when the bucket holds two or more, from 40 requests/s; a one-token bucket has none
and relies on the marketing yield), while transactional is sending (see
:data:`TRANSACTIONAL_QUIET_MS`). The provider still runs at its full rate while
marketing has work: marketing sends from a full bucket and the refill tops it up."""

TRANSACTIONAL_QUIET_MS = 250
"""Marketing keeps the headroom only while a transactional take (granted or refused) came
within this long. After that it may use the whole bucket: with the headroom a marketing
send needs the bucket full, and marketing sends coming back from the delay store at
exactly the rate find it a hair short as often as not (a third of them were refused again
once transactional was done, and the provider ran at 0.7 of its limit). The first
transactional send after a quiet spell may wait one refill (1/rate) for its token. 250 ms
measured better than 1 s, which kept the headroom through the first second after
transactional ended (``bench/results-notifications.md``)."""


def marketing_headroom(capacity: float) -> int:
    """Provider tokens a marketing send must leave in a bucket of ``capacity``."""
    if capacity < 2:
        return 0
    return max(1, math.floor(capacity * MARKETING_HEADROOM))


@dataclass(frozen=True)
class Decision:
    """The verdict of one take: granted, or wait ``wait_ms`` (``reason`` says which bucket)."""

    granted: bool
    wait_ms: int = 0
    reason: str = ""


GRANTED = Decision(True)

_REASONS = {
    1: "provider_paused",
    2: "provider_backoff",
    3: "provider_rate_limit",
    4: "tenant_rate_limit",
    5: "provider_rate_wait",
}
"""The take script's reason codes (the low three bits of its reply)."""


class RateLimiter:
    """Provider and tenant buckets for the limits in settings, in the Redis given."""

    def __init__(
        self,
        client: Any,
        *,
        profile: str,
        provider_limits: Mapping[str, RateLimit],
        tenant_limits: Mapping[str, RateLimit] | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.profile = profile
        self.provider_limits = dict(provider_limits)
        self.tenant_limits = dict(tenant_limits or {})
        self._clock_ms = clock_ms
        self._take = client.register_script(script_source("rate_limit_take"))
        self._execute = client.execute_command
        self._observe = client.register_script(script_source("rate_limit_observe"))
        self._pause = client.register_script(script_source("rate_limit_pause"))
        self._keys: dict[str, RateLimitKeys] = {}
        self._learned: dict[str, float] = {}
        self._plans: dict[tuple[str, str], tuple[str, str | None, tuple[bytes, ...]]] = {}

    def keys(self, provider: str) -> RateLimitKeys:
        keys = self._keys.get(provider)
        if keys is None:
            keys = self._keys[provider] = rate_limit_keys(self.profile, provider)
        return keys

    def limit_of(self, provider: str) -> RateLimit:
        """The configured limit; a provider without one is a configuration error."""
        limit = self.provider_limits.get(provider)
        if limit is None:
            known = ", ".join(sorted(self.provider_limits)) or "none"
            raise KeyError(
                f"provider {provider!r} has no rate limit in PLATFORM_PROVIDER_RATE_LIMITS "
                f"(configured: {known}); every provider needs one"
            )
        return limit

    def _now(self) -> str | bytes:
        return b"" if self._clock_ms is None else str(self._clock_ms())

    def take(
        self,
        provider: str,
        tenant: str,
        *,
        requests: int = 1,
        messages: int = 1,
        rail: str = "transactional",
        wait_in_place_ms: int = 0,
    ) -> Decision:
        """Take ``requests`` provider tokens and ``messages`` tenant tokens, or none.

        ``wait_in_place_ms``: a refusal by the provider bucket's rate whose turn among the
        callers already waiting in place comes within this long is answered
        ``provider_rate_wait`` with that wait, and does not queue the caller behind the
        refused callers of its rail (:class:`~platform_tasks.notifications.dispatch.Dispatcher`
        passes it for transactional sends).

        The marketing rail must leave :data:`MARKETING_HEADROOM` of the provider bucket
        for transactional sends while transactional is sending, so a password reset finds
        a token while a blast keeps the provider busy; each rail queues its refused
        callers separately.
        """
        plan = self._plans.get((provider, rail))
        if plan is None:
            plan = self._plans[(provider, rail)] = self._plan(provider, rail)
        bucket, tenant_prefix, fixed = plan
        now = b"" if self._clock_ms is None else str(self._clock_ms())
        extra = (str(wait_in_place_ms).encode(),) if wait_in_place_ms > 0 else ()
        # EVALSHA straight from the client: this is every send's one round trip
        keys = (bucket,) if tenant_prefix is None else (bucket, tenant_prefix + tenant)
        try:
            verdict = self._execute(
                "EVALSHA",
                self._take.sha,
                len(keys),
                *keys,
                now,
                fixed[0],
                b"1" if requests == 1 else requests,
                fixed[1],
                b"1" if messages == 1 else messages,
                *fixed[2:],
                *extra,
            )
        except NoScriptError:  # a restarted or flushed Redis: load it and ask again
            self._take.sha = self.client.script_load(self._take.script)
            return self.take(
                provider,
                tenant,
                requests=requests,
                messages=messages,
                rail=rail,
                wait_in_place_ms=wait_in_place_ms,
            )
        if verdict == 0:
            return GRANTED
        verdict = int(verdict)
        return Decision(False, verdict >> 3, _REASONS[verdict & 7])

    def _plan(self, provider: str, rail: str) -> tuple[str, str | None, tuple[bytes, ...]]:
        """The per-provider, per-rail keys and arguments of the take script, computed once.

        Returns the provider bucket's key, the tenant keys' prefix (None: tenants are
        unlimited) and the fixed arguments between ``now``, ``requests`` and ``messages``,
        encoded once (the client sends bytes as they are).
        """
        limit = self.limit_of(provider)
        tenant_limit = self.tenant_limits.get(provider)
        marketing = rail == "marketing"
        keys = self.keys(provider)
        texts = [
            repr(limit.per_second / 1000),
            repr(tenant_limit.per_second / 1000) if tenant_limit else "",
            repr(limit.provider_capacity),
            repr(tenant_limit.capacity) if tenant_limit else "",
            repr(marketing_headroom(limit.provider_capacity)) if marketing else "0",
            "m" if marketing else "t",
            str(TRANSACTIONAL_QUIET_MS),
        ]
        # ARGV order: now, prate, requests, trate, messages, pcap, tcap, headroom, queue,
        # quiet
        fixed = tuple(texts)
        tenant_prefix = keys.tenant("") if tenant_limit else None
        return keys.bucket, tenant_prefix, tuple(t.encode() for t in fixed)

    def back_off(self, provider: str, seconds: float) -> int:
        """Empty ``provider``'s bucket for ``seconds``: nobody sends before then. Returns ms."""
        block_ms = max(1, math.ceil(seconds * 1000))
        self._observe(keys=[self.keys(provider).bucket], args=[self._now(), block_ms, "", ""])
        return block_ms

    def learn(self, provider: str, limit_per_second: float) -> bool:
        """Lower ``provider``'s rate to what its headers say, when below the setting.

        Returns whether it was lower. Each process tells Redis once per new value.
        """
        if limit_per_second <= 0 or limit_per_second >= self.limit_of(provider).per_second:
            return False
        if self._learned.get(provider) == limit_per_second:
            return True
        self._observe(
            keys=[self.keys(provider).bucket],
            args=[self._now(), "", repr(limit_per_second / 1000), LEARNED_RATE_TTL_MS],
        )
        self._learned[provider] = limit_per_second
        return True

    def pause(self, provider: str, seconds: float, reason: str) -> tuple[bool, int]:
        """Pause ``provider`` for ``seconds``; ``(must_alert, remaining_ms)``.

        ``must_alert`` is true for exactly one caller per pause, across all workers.
        """
        keys = self.keys(provider)
        raw = cast(
            list[Any],
            self._pause(
                keys=[keys.bucket, keys.pause_alerted],
                args=[self._now(), max(1, math.ceil(seconds * 1000)), reason],
            ),
        )
        return int(raw[0]) == 1, int(raw[1])

    def now_ms(self) -> int:
        """The buckets' time in ms: Redis ``TIME`` (the injected clock in tests).

        The delay store promotes by Redis ``TIME`` too, so a due time computed from this
        and a bucket's wait comes when the bucket has its token, whatever the worker's
        own clock says.
        """
        return self._clock_ms() if self._clock_ms is not None else redis_now_ms(self.client)

    def paused_ms(self, provider: str) -> int:
        """Milliseconds the provider stays paused (0: not paused)."""
        raw = self.client.hget(self.keys(provider).bucket, "paused_until")
        if raw is None:
            return 0
        return max(0, int(float(raw)) - self.now_ms())
