"""The limits' Redis scripts against a real Redis: leases, throttles, unique locks."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis

from platform_tasks.keys import delay_keys, throttle_key_bucket
from platform_tasks.limits import Rate
from platform_tasks.limits.concurrency import ConcurrencyLeases, Lease
from platform_tasks.limits.throttle import Throttles, idle_expiry_ms
from platform_tasks.limits.unique import UniqueLocks, UniquePublish
from platform_tasks.testing.servers import wait_until


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_cap_grants_n_slots_then_refuses_and_a_job_takes_its_own_slot_back(
    redis_client: redis.Redis,
) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    assert leases.acquire("t", "k", "j1", 2, 60_000).granted
    assert leases.acquire("t", "k", "j2", 2, 60_000).granted
    refused = leases.acquire("t", "k", "j3", 2, 60_000)
    assert not refused.granted and refused.held == 2
    assert abs(refused.now_ms - redis_ms(redis_client)) < 5_000, "now is Redis TIME"
    # a redelivered j1 (its worker died, the lease still runs) is not refused by itself
    again = leases.acquire("t", "k", "j1", 2, 60_000)
    assert again.granted and again.held == 2
    assert leases.acquire("t", "other", "j3", 2, 60_000).granted, "each key its own cap"
    leases.release(Lease(leases.key("t", "k"), "j1", 60_000))
    assert leases.acquire("t", "k", "j3", 2, 60_000).granted
    assert sorted(leases.holders("t", "k")) == ["j2", "j3"]


def test_a_lease_not_renewed_ends_at_its_ttl_and_frees_the_slot(redis_client: redis.Redis) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    assert leases.acquire("t", "k", "dead", 1, 300).granted
    (score,) = [s for _, s in redis_client.zrange(leases.key("t", "k"), 0, -1, withscores=True)]
    assert score <= redis_ms(redis_client) + 300
    assert not leases.acquire("t", "k", "next", 1, 300).granted
    wait_until(
        lambda: leases.acquire("t", "k", "next", 1, 60_000).granted,
        timeout=10,
        interval=0.05,
        message="slot freed after the ttl",
    )
    assert leases.holders("t", "k") == ["next"]
    assert redis_ms(redis_client) >= score


def test_renewal_pushes_a_lease_out_and_reports_one_that_is_gone(redis_client: redis.Redis) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    assert leases.acquire("t", "k", "live", 2, 1_000).granted
    live = Lease(leases.key("t", "k"), "live", 60_000)
    gone = Lease(leases.key("t", "k"), "never-acquired", 60_000)
    assert leases.renew([live, gone]) == 1
    (score,) = [s for m, s in redis_client.zrange(live.key, 0, -1, withscores=True)]
    assert score > redis_ms(redis_client) + 30_000
    assert redis_client.pttl(live.key) > 30_000


def test_waiting_on_a_cap_is_counted_until_the_job_gets_a_slot(redis_client: redis.Redis) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    leases.acquire_and_track("t", "k", "a", 1, 60_000, 1_000)
    decision, waiting = leases.acquire_and_track("t", "k", "b", 1, 60_000, 1_000)
    assert not decision.granted and waiting == 1 and leases.waiting("t") == 1
    leases.release(Lease(leases.key("t", "k"), "a", 60_000))
    decision, waiting = leases.acquire_and_track("t", "k", "b", 1, 60_000, 1_000)
    assert decision.granted and waiting == 0


def test_a_key_throttle_grants_its_rate_then_waits_and_keys_are_independent(
    redis_client: redis.Redis,
) -> None:
    throttles = Throttles(redis_client, profile="test")
    rate = Rate(2, 1)  # a reserve of one token: one grant, then one every 500 ms
    assert throttles.take("t", "a", rate, None).granted
    refused = throttles.take("t", "a", rate, None)
    assert not refused.granted and refused.reason == "throttle" and 0 < refused.wait_ms <= 1000
    # the next refused caller is queued behind the first: a later slot
    later = throttles.take("t", "a", rate, None)
    assert not later.granted and later.wait_ms > refused.wait_ms
    assert throttles.take("t", "b", rate, None).granted
    # one bucket per key: it expires once idle
    bucket = throttle_key_bucket("test", "t", "a")
    assert 0 < redis_client.pttl(bucket) <= idle_expiry_ms(rate)


def test_a_task_total_throttle_holds_across_keys(redis_client: redis.Redis) -> None:
    throttles = Throttles(redis_client, profile="test")
    total = Rate(1, 60)
    assert throttles.take("t", "a", Rate(100, 1), total).granted
    refused = throttles.take("t", "b", Rate(100, 1), total)
    assert not refused.granted and refused.reason == "throttle_total"
    assert refused.wait_ms > 50_000


def test_unique_skip_keeps_the_first_job_and_release_is_the_owners(
    redis_client: redis.Redis,
) -> None:
    locks = UniqueLocks(redis_client, delay_keys("test"))
    assert locks.claim_now("k", "job-1", 60_000) is None
    assert locks.claim_now("k", "job-2", 60_000) == "job-1"
    assert not locks.release("k", "job-2")
    assert locks.release("k", "job-1")
    assert locks.claim_now("k", "job-2", 60_000) is None


def test_debounce_replaces_the_waiting_entry_and_keeps_its_id_and_due_time(
    redis_client: redis.Redis,
) -> None:
    keys = delay_keys("test")
    locks = UniqueLocks(redis_client, keys)
    request = UniquePublish("d", 60_000, "debounce")

    def entry(data: str) -> Callable[[str], str]:
        return lambda job: json.dumps({"q": "x", "m": f"{job}:{data}"})

    first = locks.store(request, "job-1", "entry-1", None, 30_000, entry("v1"))
    due = redis_client.zscore(keys.schedule, "entry-1")
    assert first == "job-1" and due is not None and due > redis_ms(redis_client) + 20_000
    second = locks.store(request, "job-2", "entry-2", None, 30_000, entry("v2"))
    assert second == "job-1"
    assert redis_client.zrange(keys.schedule, 0, -1) == [b"entry-1"]
    assert redis_client.zscore(keys.schedule, "entry-1") == due
    stored = json.loads(redis_client.hget(keys.entries, "entry-1"))
    assert stored["m"] == "job-1:v2", "the waiting job keeps its id and takes the latest data"
    # once the entry left the store (promoted), a debounce publish is a new job
    redis_client.hdel(keys.entries, "entry-1")
    redis_client.zrem(keys.schedule, "entry-1")
    third = locks.store(request, "job-3", "entry-3", None, 30_000, entry("v3"))
    assert third == "job-3"
    skip = UniquePublish("s", 60_000, "skip")
    assert locks.store(skip, "job-4", "entry-4", None, 30_000, entry("a")) == "job-4"
    assert locks.store(skip, "job-5", "entry-5", None, 30_000, entry("b")) == "job-4"
    assert redis_client.hexists(keys.entries, "entry-5") == 0


def test_a_flushed_script_cache_is_reloaded_on_the_jobs_path(redis_client: redis.Redis) -> None:
    leases = ConcurrencyLeases(redis_client, profile="test")
    throttles = Throttles(redis_client, profile="test")
    redis_client.script_flush()
    decision, _ = leases.acquire_and_track("t", "k", "j", 1, 60_000, 1_000)
    assert decision.granted
    assert throttles.take("t", "k", Rate(10, 1), None).granted
    redis_client.script_flush()
    assert leases.renew([Lease(leases.key("t", "k"), "j", 60_000)]) == 0
