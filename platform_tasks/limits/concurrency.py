"""Per-key concurrency caps across all workers: leases in Redis that end with their worker.

A job of a capped task takes a slot of its key before its handler runs
(``concurrency_acquire.lua``: at most N job ids in the key's sorted set, each scored by
its lease's expiry by Redis ``TIME``). While the handler runs, a renewer thread of the
worker process pushes the expiry out every third of the ttl; when it ends the slot is
released. A worker that is SIGKILLed releases nothing and renews nothing, so its slots
free when their leases expire: within the ttl, never a permanent leak.

A job refused a slot is not run and does not wait in its worker process: the caller
raises :class:`~platform_tasks.errors.Throttled`, which puts it in the delay store with
the same attempt (see :mod:`platform_tasks.limits.admission`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from platform_tasks.brokers.redis_client import REDIS_ERRORS
from platform_tasks.brokers.scripts import script_source
from platform_tasks.keys import cap_waiting_member, concurrency_key, concurrency_waiting_key
from platform_tasks.limits.scripting import evalsha, pipelined

logger = logging.getLogger(__name__)

WAITING_GRACE_MS = 60_000
"""A job refused by its cap counts as waiting until this long after it was due back: one
that never came back (cancelled, its message lost) leaves the count then."""

IDLE_INTERVAL_S = 10.0
"""How long the renewer sleeps with no lease held (a new lease with a shorter renewal
interval wakes it)."""

__all__ = [
    "WAITING_GRACE_MS",
    "CapDecision",
    "ConcurrencyLeases",
    "Lease",
    "LeaseRenewer",
    "renew_interval_s",
]


@dataclass(frozen=True)
class CapDecision:
    """The answer of one acquire: granted or not, Redis ``TIME`` in ms, slots now held."""

    granted: bool
    now_ms: int
    held: int


@dataclass(frozen=True)
class Lease:
    """A slot held by one running job: the key's sorted set, the job id, the ttl."""

    key: str
    job_id: str
    ttl_ms: int


def renew_interval_s(ttl_ms: int) -> float:
    """Renew every third of the ttl: two renewals can fail before a live job loses its slot."""
    return max(0.05, ttl_ms / 3000)


class ConcurrencyLeases:
    """Acquire, renew and release slots in the platform's Redis (the caller's client)."""

    def __init__(self, client: Any, *, profile: str) -> None:
        self.client = client
        self.profile = profile
        self._acquire = client.register_script(script_source("concurrency_acquire"))
        self._renew = client.register_script(script_source("concurrency_renew"))
        self._seen_ms = 0

    def key(self, task: str, key: str) -> str:
        return concurrency_key(self.profile, task, key)

    def acquire(self, task: str, key: str, job_id: str, cap: int, ttl_ms: int) -> CapDecision:
        raw = cast(list[Any], self._acquire(keys=[self.key(task, key)], args=[job_id, cap, ttl_ms]))
        return CapDecision(bool(int(raw[0])), int(raw[1]), int(raw[2]))

    def acquire_and_track(
        self,
        task: str,
        key: str,
        job_id: str,
        cap: int,
        ttl_ms: int,
        retry_ms: int,
        queue: str = "",
    ) -> tuple[CapDecision, int]:
        """:meth:`acquire`, and keep the task's set of jobs waiting on a cap up to date.

        A granted job leaves the set; a refused one is in it until it is due back plus
        :data:`WAITING_GRACE_MS`, with the queue it comes back to and its key (the
        runnable gauge, :mod:`platform_tasks.limits.parked`, reads them). Returns the
        decision and the jobs waiting on a cap of ``task`` after it (the
        ``platform_jobs_waiting_on_cap`` gauge).
        """
        waiting = concurrency_waiting_key(self.profile, task)
        member = cap_waiting_member(job_id, queue, key)

        # a granted job costs one round trip: the acquire, leaving the waiting set, its
        # count, and dropping entries stale by the Redis time this process saw last
        def build(pipe: Any) -> None:
            evalsha(pipe, self._acquire, [self.key(task, key)], [job_id, cap, ttl_ms])
            pipe.zrem(waiting, member)
            pipe.zremrangebyscore(waiting, "-inf", self._seen_ms - WAITING_GRACE_MS)
            pipe.zcard(waiting)

        raw, _, _, counted = pipelined(self.client, build, [self._acquire])
        decision = CapDecision(bool(int(raw[0])), int(raw[1]), int(raw[2]))
        self._seen_ms = max(self._seen_ms, decision.now_ms)
        if decision.granted:
            return decision, int(counted)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(waiting, {member: decision.now_ms + retry_ms})
            pipe.pexpire(waiting, retry_ms + WAITING_GRACE_MS)
            pipe.zcard(waiting)
            counted = pipe.execute()[-1]
        return decision, int(counted)

    def waiting(self, task: str) -> int:
        """Jobs of ``task`` waiting on a cap (refused, due back within the grace)."""
        return int(self.client.zcard(concurrency_waiting_key(self.profile, task)))

    def renew(self, leases: list[Lease]) -> int:
        """Renew ``leases`` in one pipelined round trip; returns how many were gone."""
        if not leases:
            return 0

        def build(pipe: Any) -> None:
            for lease in leases:
                evalsha(pipe, self._renew, [lease.key], [lease.ttl_ms, lease.job_id])

        results = pipelined(self.client, build, [self._renew])
        return sum(1 for result in results if int(result) == 0)

    def release(self, lease: Lease) -> None:
        self.client.zrem(lease.key, lease.job_id)

    def holders(self, task: str, key: str) -> list[str]:
        """Job ids holding a slot of ``(task, key)`` (expired leases included until the next
        acquire drops them)."""
        return [
            m.decode() for m in cast(list[bytes], self.client.zrange(self.key(task, key), 0, -1))
        ]


class LeaseRenewer:
    """One daemon thread per worker process renewing the leases of the jobs it runs.

    A prefork child runs one job at a time, a thread pool several: the thread renews all
    held leases together every third of the shortest ttl. A renewal that fails (Redis
    away) is logged and tried again on the next tick; a lease found gone is logged (the
    job runs on: stopping a handler midway is worse than one job over the cap).
    """

    def __init__(self, leases: Callable[[], ConcurrencyLeases]) -> None:
        self._leases = leases
        self._held: dict[tuple[str, str], Lease] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._interval = IDLE_INTERVAL_S

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[(lease.key, lease.job_id)] = lease
        self._ensure_thread()
        if renew_interval_s(lease.ttl_ms) < self._interval:
            self._wake.set()  # the thread sleeps longer than this lease allows: recompute

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop((lease.key, lease.job_id), None)

    def held(self) -> list[Lease]:
        with self._lock:
            return list(self._held.values())

    def stop(self) -> None:
        """End this process's renewal thread (the app is closing; its leases go with it)."""
        self._stopped = True
        self._wake.set()

    def _ensure_thread(self) -> None:
        # a forked child inherits the object but not the thread: start one per process
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._loop, name="platform-lease-renewer", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped:
            held = self.held()
            interval = min(
                (renew_interval_s(lease.ttl_ms) for lease in held), default=IDLE_INTERVAL_S
            )
            self._interval = interval
            if self._wake.wait(interval):
                self._wake.clear()
                continue  # woken by a shorter lease or by stop()
            held = self.held()
            if not held:
                continue
            try:
                lost = self._leases().renew(held)
            except REDIS_ERRORS:
                logger.warning(
                    "could not renew concurrency leases; trying again",
                    exc_info=True,
                    extra={"event": "limits.lease_renew_failed", "leases": len(held)},
                )
                continue
            if lost:
                logger.warning(
                    "%d concurrency lease(s) expired before their renewal: their keys may run "
                    "over the cap until these jobs end",
                    lost,
                    extra={"event": "limits.lease_lost", "leases": lost},
                )
