"""Per-key throttles for any task, on the notification limiter's token-bucket script.

``rate_limit_take.lua`` takes from two buckets or from neither, judged by Redis ``TIME``,
and gives each refused caller a slot after the callers refused before it, so a thousand
jobs refused at once come back spread over the time their tokens need. Here the two
levels are the task's total (``throttle_total``, optional) and the job's key
(``throttle``); without a total the key's bucket is the script's first level. Both levels
hold a small reserve only (5 % of a second's rate, at least one token), and a first level
also never grants more than the rate's count within any 1000 ms (1030 ms: see
:data:`WINDOW_MARGIN_MS`), so a task throttled to N/s runs no faster than N/s across all
workers, even right after an idle spell.

A refused job waits in the delay store and comes back at its slot, give or take the
promoter's and the fetch's jitter (ms to tens of ms); a few ms early it found the token
not yet there (or the sliding second not yet passed), was refused again and queued behind
every job refused meanwhile, while its token went unused: a ``5/s`` throttle ran at 3 jobs/s
across two workers. A caller may therefore ask to be told to wait in place for a
first-level token that comes within ``wait_in_place_ms`` (the script's in-place waiters,
spaced one token apart among themselves, as a transactional email's); the admission hook
does, for a short bound (:data:`~platform_tasks.limits.admission.THROTTLE_WAIT_IN_PLACE_MS`).

Nothing here drops a job: a refusal is a wait (``Throttled``, no attempt spent). Redis
errors are not caught: a throttle that cannot ask Redis must not run the job, and the
pipeline waits with the job unacked until Redis answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from platform_tasks.brokers.scripts import script_source
from platform_tasks.keys import throttle_key_bucket, throttle_total_bucket
from platform_tasks.limits.scripting import evalsha, pipelined
from platform_tasks.settings.rate_limits import RateLimit

__all__ = ["ThrottleDecision", "Throttles"]

_REASONS = {3: "throttle_total", 4: "throttle"}
WINDOW_MARGIN_MS = 30
"""The sliding second of a task throttle spans 1000 ms plus this: a handler starts a few
ms after its grant (more on a loaded machine), so grants exactly 1000 ms apart could show
one start too many within some 1000 ms of the handlers' clocks. Costs at most 3 % of the
rate; the token bucket itself refills at exactly the rate."""

_IN_PLACE = 5
"""The script's reason for "wait this long where you are, then ask again"."""


def idle_expiry_ms(rate: RateLimit) -> int:
    """How long a key's bucket outlives its last take: two refills of one token plus the
    second the script's sliding window looks back, at least 2 s. An expired bucket is a
    full one, which is what it would be by then anyway."""
    return max(2000, math.ceil(2000 / rate.per_second) + 1000 + WINDOW_MARGIN_MS)


@dataclass(frozen=True)
class ThrottleDecision:
    """``granted``, or refused for ``wait_ms``: in the delay store, or where the job is
    when ``in_place`` (its first-level token comes within the ``wait_in_place_ms`` asked)."""

    granted: bool
    wait_ms: int = 0
    reason: str = ""
    in_place: bool = False


GRANTED = ThrottleDecision(True)


class Throttles:
    """Take one token of a task's key (and of its total) in the platform's Redis."""

    def __init__(self, client: Any, *, profile: str) -> None:
        self.client = client
        self.profile = profile
        self._take = client.register_script(script_source("rate_limit_take"))

    def take(
        self,
        task: str,
        key: str | None,
        rate: RateLimit | None,
        total: RateLimit | None,
        *,
        wait_in_place_ms: int = 0,
    ) -> ThrottleDecision:
        """One token of ``key`` at ``rate`` and of the task at ``total``, or none.

        ``wait_in_place_ms``: a refusal by the first level (the total, else the key) whose
        turn among the callers waiting in place comes within this long is returned with
        ``in_place`` set, and the caller is not queued behind the delay store's."""
        levels = self._levels(task, key, rate, total)
        if levels is None:
            return GRANTED
        first, first_rate, second, second_rate = levels
        keys = [first] if second is None else [first, second]
        # ARGV: now, prate, requests, trate, messages, pcap, tcap, headroom, queue, quiet
        args = [
            "",
            repr(first_rate.per_second / 1000),
            1,
            repr(second_rate.per_second / 1000) if second_rate else "",
            1,
            repr(first_rate.provider_capacity),
            repr(second_rate.provider_capacity) if second_rate else "",
            0,
            "t",
            0,
        ]
        args += [max(0, int(wait_in_place_ms)), 1000 + WINDOW_MARGIN_MS]
        if second is None and total is None:
            # the script never expires its first level (a provider's bucket is one of a
            # few); a key's bucket is one of as many keys as there are tenants: let it go
            # once idle, renewed by every take
            expiry = idle_expiry_ms(first_rate)

            def build(pipe: Any) -> None:
                evalsha(pipe, self._take, keys, args)
                pipe.pexpire(first, expiry)

            verdict = int(pipelined(self.client, build, [self._take])[0])
        else:
            verdict = int(self._take(keys=keys, args=args))
        return _decision(verdict, two_levels=second is not None, total=total is not None)

    def _levels(
        self, task: str, key: str | None, rate: RateLimit | None, total: RateLimit | None
    ) -> tuple[str, RateLimit, str | None, RateLimit | None] | None:
        """The buckets to take from, first level first, with their rates; ``None`` when the
        task has no throttle that applies to this job."""
        key_bucket = (
            throttle_key_bucket(self.profile, task, key)
            if key is not None and rate is not None
            else None
        )
        if total is not None:
            return (
                throttle_total_bucket(self.profile, task),
                total,
                key_bucket,
                rate if key_bucket else None,
            )
        if key_bucket is not None and rate is not None:
            return key_bucket, rate, None, None
        return None


def _decision(verdict: int, *, two_levels: bool, total: bool) -> ThrottleDecision:
    """The take script's verdict (0, or the wait in ms shifted over the reason's 3 bits)."""
    if verdict == 0:
        return GRANTED
    reason = verdict & 7
    if reason == _IN_PLACE:
        level = "throttle" if not two_levels and not total else "throttle_total"
        return ThrottleDecision(False, verdict >> 3, level, in_place=True)
    if not two_levels:
        return ThrottleDecision(False, verdict >> 3, "throttle" if not total else "throttle_total")
    return ThrottleDecision(False, verdict >> 3, _REASONS.get(reason, "throttle"))
