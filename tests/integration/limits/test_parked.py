"""Jobs back on their queue behind a full cap, counted per key from the refusals recorded in
a real Redis (the runnable gauge's part from :mod:`platform_tasks.limits.parked`)."""

from __future__ import annotations

import redis

from platform_tasks.keys import cap_waiting_member, concurrency_waiting_key
from platform_tasks.limits.concurrency import ConcurrencyLeases, Lease
from platform_tasks.limits.parked import CappedTask, blocked_on_caps
from platform_tasks.testing.servers import wait_until


def test_of_the_jobs_due_back_on_one_key_only_its_free_slots_could_start(
    redis_client: redis.Redis,
) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    for holder in ("h1", "h2"):
        assert leases.acquire("t", "full", holder, 2, 60_000).granted
    assert leases.acquire("t", "half", "h3", 2, 60_000).granted
    # refused with 1 ms to wait: due back (on their queues) at once
    for job, key, queue in [
        ("f1", "full", "q"),
        ("f2", "full", "other"),
        ("h4", "half", "q"),
        ("h5", "half", "q"),
        ("h6", "half", "q"),
    ]:
        decision, _ = leases.acquire_and_track("t", key, job, 2, 60_000, 1, queue)
        assert not decision.granted or key == "half"
    # ``half`` had one free slot: h4 took it, h5 and h6 were refused
    waiting = concurrency_waiting_key("test", "t")
    assert redis_client.zscore(waiting, cap_waiting_member("h4", "q", "half")) is None
    tasks = [CappedTask("t", 2)]
    wait_until(
        lambda: blocked_on_caps(redis_client, "test", tasks) == {"q": 3, "other": 1},
        timeout=5,
        interval=0.01,
        message="every refused job due back and counted",
    )
    # a slot of ``half`` frees: one of its two jobs due back could start now
    leases.release(Lease(leases.key("t", "half"), "h3", 60_000))
    assert blocked_on_caps(redis_client, "test", tasks) == {"q": 2, "other": 1}
    # a job not due back yet waits in the delay store, not on its queue: not counted here
    leases.acquire_and_track("t", "full", "later", 2, 60_000, 600_000, "q")
    assert blocked_on_caps(redis_client, "test", tasks) == {"q": 2, "other": 1}
    assert blocked_on_caps(redis_client, "test", []) == {}
