"""The consumer's hook: a job passes its limits before its handler runs, or waits.

:func:`admit` is called by the delivery pipeline after the job's idempotency claim and
before ``task.execute``. In order:

1. the concurrency cap (``concurrency_key``/``max_concurrency``): take a slot or wait
   ``concurrency_retry`` (jittered) from Redis ``TIME``;
2. the throttle (``throttle_key``/``throttle``, ``throttle_total``): take a token or wait
   for the slot the token bucket gives, from Redis ``TIME``; a slot taken in step 1 is
   given back first. A token that comes within :data:`THROTTLE_WAIT_IN_PLACE_MS` is
   waited for here, holding the worker process that long (see
   :mod:`~platform_tasks.limits.throttle`: through the delay store the job would come
   back a few ms off its slot and often be refused again, its token unused);
3. release the job's unique publish key, if it was published with one: it has started.

A wait raises :class:`~platform_tasks.errors.Throttled`: the pipeline rolls the
transaction back and stores the job in the delay store with the same attempt (no attempt
spent, no worker process held while it waits) — the path notifications' rate limits
take. A Redis error raises :class:`~platform_tasks.errors.ServersUnavailable`: the
delivery waits unacked with nothing spent, like every other outage of the platform's
servers (a limit that cannot be checked is not ignored).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from platform_tasks.app_state import ProcessState
from platform_tasks.brokers.delay_location import delay_store_location
from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.brokers.server_time import redis_now_ms
from platform_tasks.epoch import from_epoch_ms
from platform_tasks.errors import ServersUnavailable, Throttled
from platform_tasks.limits.concurrency import ConcurrencyLeases, Lease, LeaseRenewer
from platform_tasks.limits.metrics import record_cap
from platform_tasks.limits.options import NO_LIMITS, LimitSpec, key_text
from platform_tasks.limits.throttle import Throttles
from platform_tasks.limits.unique import UniqueLocks

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)

__all__ = ["Admitted", "LimitsRuntime", "admit", "cap_wait_ms", "runtime_for"]

CAP_REASON = "concurrency_cap"

THROTTLE_WAIT_IN_PLACE_MS = 250
"""How long in all a job refused by its throttle may wait for its token where it is,
holding its worker process, before it goes round the delay store. At ``5/s`` the next
token is 200 ms away; a job back from the delay store a few ms before its slot waits those
ms rather than queueing behind every job refused meanwhile. Slower throttles (a token
farther away than this) always wait in the delay store."""


def cap_wait_ms(retry: timedelta, draw: Callable[[], float] = random.random) -> int:
    """How long a job refused by its cap waits: ``retry`` plus up to half of it, drawn
    at random, so jobs refused together do not all come back together."""
    base = retry.total_seconds() * 1000
    return max(1, int(base + base * 0.5 * draw()))


def due_at(now_ms: int, wait_ms: int) -> datetime:
    """The due time ``wait_ms`` after ``now_ms`` (Redis ``TIME``), as the delay store reads it."""
    return from_epoch_ms(now_ms + wait_ms)


@dataclass
class Admitted:
    """What a job holds while its handler runs; :meth:`release` when it has ended."""

    runtime: LimitsRuntime | None = None
    leases: list[Lease] = field(default_factory=list)

    def release(self) -> None:
        if self.runtime is None:
            return
        for lease in self.leases:
            self.runtime.renewer.drop(lease)
            try:
                self.runtime.leases().release(lease)
            except REDIS_ERRORS:
                logger.warning(
                    "could not release a concurrency slot; it frees when its lease expires",
                    exc_info=True,
                    extra={"event": "limits.release_failed", "key": lease.key},
                )
        self.leases.clear()


NOTHING_HELD = Admitted()


class LimitsRuntime:
    """One process's connections for the limits of one app (made on first use)."""

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self.settings = app.platform_settings
        self._client: Any = None
        self._leases: ConcurrencyLeases | None = None
        self._throttles: Throttles | None = None
        self._unique: UniqueLocks | None = None
        self.renewer = LeaseRenewer(self.leases)
        self.sleep: Callable[[float], None] = time.sleep
        """How a throttled job waits in place for a near token (tests wait on Redis TIME)."""

    def close(self) -> None:
        """Close the Redis connections and stop renewing leases (``app.close()``)."""
        self.renewer.stop()
        for client in (self._client, self._unique.client if self._unique else None):
            if client is not None:
                client.close()
        self._client = self._leases = self._throttles = self._unique = None

    def client(self) -> Any:
        if self._client is None:
            self._client = build_redis(self.settings, timeout=10, connect_timeout=5)
        return self._client

    def leases(self) -> ConcurrencyLeases:
        if self._leases is None:
            self._leases = ConcurrencyLeases(self.client(), profile=self.settings.profile)
        return self._leases

    def throttles(self) -> Throttles:
        if self._throttles is None:
            self._throttles = Throttles(self.client(), profile=self.settings.profile)
        return self._throttles

    def unique(self) -> UniqueLocks | None:
        """The unique publish locks, beside the delay store (``None``: no store, so no
        unique publish could have locked anything)."""
        if self._unique is None:
            location = delay_store_location(self.settings)
            if location is not None:
                client = location.connect(timeout=10, connect_timeout=5)
                self._unique = UniqueLocks(client, location.keys)
        return self._unique


_runtimes: ProcessState[LimitsRuntime] = ProcessState(
    "platform_limits_runtime", LimitsRuntime, LimitsRuntime.close
)


def runtime_for(app: PlatformCelery) -> LimitsRuntime:
    """This process's limits connections for ``app`` (made on first use, again after a
    fork; ``app.close()`` closes them)."""
    return _runtimes.get(app)


def spec_of(task: Any) -> LimitSpec:
    spec: LimitSpec = getattr(type(task), "platform_limits", NO_LIMITS)
    return spec


def admit(
    task: Any, envelope: Any, unique_key: str | None = None, queue: str | None = None
) -> Admitted:
    """Pass the job's limits (see the module docstring) or raise ``Throttled``.

    ``queue`` is the queue the delivery came from, where a job refused by its cap comes
    back (recorded with the refusal for the runnable gauge)."""
    spec = spec_of(task)
    if not spec.limited and unique_key is None:
        return NOTHING_HELD
    runtime = runtime_for(task.app)
    admitted = Admitted(runtime)
    job = str(envelope.job_id)
    try:
        if spec.max_concurrency is not None and spec.concurrency_key is not None:
            key = key_text(spec.concurrency_key, envelope)
            if key is not None:
                ttl_ms = int(spec.lease_ttl.total_seconds() * 1000)
                wait_ms = cap_wait_ms(spec.cap_retry)
                decision, waiting = runtime.leases().acquire_and_track(
                    task.name, key, job, spec.max_concurrency, ttl_ms, wait_ms, queue or ""
                )
                record_cap(task.name, refused=not decision.granted, waiting=waiting)
                if not decision.granted:
                    raise Throttled(due_at(decision.now_ms, wait_ms), CAP_REASON)
                lease = Lease(runtime.leases().key(task.name, key), job, ttl_ms)
                admitted.leases.append(lease)
                runtime.renewer.hold(lease)
        if spec.throttle is not None or spec.throttle_total is not None:
            key = None if spec.throttle_key is None else key_text(spec.throttle_key, envelope)
            _take_throttle(runtime, task.name, key, spec, admitted)
        if unique_key is not None:
            _release_unique(runtime, unique_key, job)
    except REDIS_ERRORS as exc:
        admitted.release()
        raise ServersUnavailable(f"limits: Redis did not answer ({type(exc).__name__})") from exc
    except BaseException:
        admitted.release()
        raise
    return admitted


def _take_throttle(
    runtime: LimitsRuntime, task: str, key: str | None, spec: LimitSpec, admitted: Admitted
) -> None:
    """Take the throttle's token, waiting in place for one within
    :data:`THROTTLE_WAIT_IN_PLACE_MS` in all, or raise ``Throttled`` with the slot given."""
    waited = 0
    while True:
        taken = runtime.throttles().take(
            task,
            key,
            spec.throttle,
            spec.throttle_total,
            wait_in_place_ms=max(0, THROTTLE_WAIT_IN_PLACE_MS - waited),
        )
        if taken.granted:
            return
        if not taken.in_place:
            admitted.release()
            raise Throttled(due_at(redis_now_ms(runtime.client()), taken.wait_ms), taken.reason)
        runtime.sleep(taken.wait_ms / 1000)
        waited += taken.wait_ms


def release_unique(app: PlatformCelery, unique_key: str, job: str) -> None:
    """Release ``job``'s unique publish key when the job will never start (cancelled,
    dead-lettered before it ran): otherwise the key stays locked for its ``unique_for``
    and every publish of it meanwhile returns a job that will not run. Best effort;
    a later job's lock is kept."""
    _release_unique(runtime_for(app), unique_key, job)


def _release_unique(runtime: LimitsRuntime, unique_key: str, job: str) -> None:
    """Best effort: a lock not released here ends at its ``unique_for``."""
    try:
        locks = runtime.unique()
        if locks is not None:
            locks.release(unique_key, job)
    except REDIS_ERRORS:
        logger.warning(
            "could not release a unique publish key; it ends at its unique_for",
            exc_info=True,
            extra={"event": "limits.unique_release_failed"},
        )
