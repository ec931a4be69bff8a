"""The two-level token bucket script against a real Redis, time driven by an explicit clock."""

from __future__ import annotations

import redis
from redis.cluster import key_slot

from platform_tasks.notifications.limiter import Decision, RateLimiter
from platform_tasks.notifications.rate_limits import RateLimit


class Clock:
    """Milliseconds the test moves by hand."""

    def __init__(self, start: int = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


def limiter(
    client: redis.Redis, clock: Clock, *, provider: RateLimit, tenant: RateLimit | None = None
) -> RateLimiter:
    return RateLimiter(
        client,
        profile="test",
        provider_limits={"resend": provider},
        tenant_limits={"resend": tenant} if tenant else {},
        clock_ms=clock,
    )


def tokens(client: redis.Redis, key: str) -> float:
    value = client.hget(key, "tokens")
    assert value is not None
    return float(value)


def test_refused_tenant_takes_no_provider_token(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(1000, 1), tenant=RateLimit(2, 1))
    assert lim.take("resend", "acme", messages=2).granted
    before = tokens(redis_client, lim.keys("resend").bucket)
    refused = lim.take("resend", "acme", messages=1)
    assert not refused.granted
    assert refused.reason == "tenant_rate_limit"
    assert refused.wait_ms == 500  # one message at 2/s
    assert tokens(redis_client, lim.keys("resend").bucket) == before
    # another tenant is not held back by acme's empty bucket
    assert lim.take("resend", "globex", messages=1).granted


def test_refused_provider_takes_no_tenant_token(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(1, 1), tenant=RateLimit(100, 1))
    assert lim.take("resend", "acme", messages=10).granted
    before = tokens(redis_client, lim.keys("resend").tenant("acme"))
    refused = lim.take("resend", "acme", messages=10)
    assert (refused.granted, refused.reason, refused.wait_ms) == (
        False,
        "provider_rate_limit",
        1000,
    )
    assert tokens(redis_client, lim.keys("resend").tenant("acme")) == before


def test_bucket_refills_at_its_rate(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(200, 1))
    # a provider bucket holds 5 % of a second's worth: 10 tokens at 200/s
    assert [lim.take("resend", "acme").granted for _ in range(11)] == [True] * 10 + [False]
    clock.now += 60_000
    assert all(lim.take("resend", "acme").granted for _ in range(10))
    refused = lim.take("resend", "acme")
    assert (refused.granted, refused.wait_ms) == (False, 5)
    clock.now += 4
    assert not lim.take("resend", "acme").granted
    clock.now += 6  # the two refusals hold the slots at +5 ms and +10 ms
    assert lim.take("resend", "acme").granted
    clock.now += 60_000  # a long pause never fills beyond the capacity
    assert [lim.take("resend", "acme").granted for _ in range(11)] == [True] * 10 + [False]


def test_per_minute_limit(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(30, 60))
    assert lim.take("resend", "acme").granted
    assert lim.take("resend", "acme").wait_ms == 2000


def test_tenant_bucket_holds_one_period(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(1000, 1), tenant=RateLimit(10, 60))
    assert [lim.take("resend", "acme").granted for _ in range(11)] == [True] * 10 + [False]
    assert lim.take("resend", "globex").granted


def test_batch_larger_than_the_tenant_bucket_passes_at_the_long_run_rate(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(50, 1), tenant=RateLimit(10, 1))
    assert lim.take("resend", "acme", messages=100).granted
    refused = lim.take("resend", "acme", messages=100)
    assert refused.reason == "tenant_rate_limit"
    assert refused.wait_ms == 10_000  # 90 messages of debt + 10 to fill, at 10/s
    clock.now += 10_000
    assert lim.take("resend", "acme", messages=100).granted


def test_two_token_bucket_keeps_one_for_transactional(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(48, 1))  # 2 tokens
    assert lim.take("resend", "acme", rail="marketing").granted
    assert not lim.take("resend", "acme", rail="marketing").granted
    assert lim.take("resend", "acme").granted


def test_provider_429_empties_the_bucket_for_every_caller_until_retry_after(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(50, 1))
    other_worker = limiter(redis_client, clock, provider=RateLimit(50, 1))
    assert lim.take("resend", "acme").granted
    lim.back_off("resend", 3)
    refused = other_worker.take("resend", "globex")
    assert (refused.granted, refused.reason, refused.wait_ms) == (False, "provider_backoff", 3000)
    clock.now += 2_999
    assert not other_worker.take("resend", "globex").granted
    clock.now += 1
    assert other_worker.take("resend", "globex").granted
    # the bucket restarts from one token: the next waits for the refill
    assert other_worker.take("resend", "globex").reason == "provider_rate_limit"


def test_shorter_back_off_never_shortens_a_longer_one(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(50, 1))
    lim.back_off("resend", 5)
    lim.back_off("resend", 1)
    assert lim.take("resend", "acme").wait_ms == 5000


def test_learns_a_lower_limit_from_headers(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(200, 1))
    assert lim.learn("resend", 40) is True
    assert lim.learn("resend", 400) is False  # higher than the setting: the setting holds
    clock.now += 60_000
    # 40/s with the capacity scaled alike: 2 tokens, then one every 25 ms
    assert [lim.take("resend", "acme").granted for _ in range(3)] == [True, True, False]
    clock.now += 60_000
    lim.take("resend", "acme")
    lim.take("resend", "acme")
    assert lim.take("resend", "acme").wait_ms == 25


def test_quota_pause_alerts_once_and_refuses_until_it_ends(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(10, 1))
    other_worker = limiter(redis_client, clock, provider=RateLimit(10, 1))
    first, remaining = lim.pause("resend", 30, "daily_quota_exceeded")
    second, _ = other_worker.pause("resend", 30, "daily_quota_exceeded")
    assert (first, second) == (True, False)
    assert 29_000 < remaining <= 30_000
    refused = other_worker.take("resend", "acme")
    assert refused.reason == "provider_paused"
    assert 0 < refused.wait_ms <= 30_000
    assert lim.paused_ms("resend") > 0


def test_redis_time_is_the_clock_by_default(redis_client: redis.Redis) -> None:
    lim = RateLimiter(redis_client, profile="test", provider_limits={"resend": RateLimit(1, 60)})
    assert lim.take("resend", "acme").granted
    refused = lim.take("resend", "acme")
    assert not refused.granted
    assert 50_000 < refused.wait_ms <= 60_000


def test_every_key_of_a_provider_shares_one_cluster_slot(redis_client: redis.Redis) -> None:
    lim = RateLimiter(redis_client, profile="test", provider_limits={"resend": RateLimit(1, 1)})
    keys = lim.keys("resend")
    slots = {
        key_slot(k.encode())
        for k in (
            keys.bucket,
            keys.pause_alerted,
            keys.tenant("acme"),
            keys.tenant("globex"),
        )
    }
    assert len(slots) == 1


def test_full_tenant_bucket_expires(redis_client: redis.Redis) -> None:
    lim = RateLimiter(
        redis_client,
        profile="test",
        provider_limits={"resend": RateLimit(9, 1)},
        tenant_limits={"resend": RateLimit(100, 1)},
    )
    assert lim.take("resend", "acme").granted
    ttl = redis_client.pttl(lim.keys("resend").tenant("acme"))
    assert 0 < ttl <= 1_100


def test_callers_refused_together_get_staggered_slots(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(10, 1))
    while lim.take("resend", "acme").granted:
        pass
    waits = [lim.take("resend", "acme").wait_ms for _ in range(5)]
    # the first refusal above already holds the slot at +100 ms
    assert waits == [200, 300, 400, 500, 600]
    clock.now += 200
    assert lim.take("resend", "acme").granted


def test_marketing_leaves_headroom_for_transactional(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(200, 1))
    marketing = 0
    while lim.take("resend", "acme", rail="marketing").granted:
        marketing += 1
    assert marketing == 8  # 20 % of the 10-token bucket stays for transactional sends
    assert [lim.take("resend", "acme").granted for _ in range(3)] == [True, True, False]
    # each rail queues its refused callers apart: transactional is not behind marketing
    for _ in range(20):
        lim.take("resend", "acme", rail="marketing")
    assert lim.take("resend", "acme").wait_ms <= 20


def test_back_off_learned_rate_and_pause_each_apply_after_an_expired_one(
    redis_client: redis.Redis,
) -> None:
    """The take script reads the back-off, learned-rate and pause fields only while the
    bucket's ``state`` flag says one is stored, and drops the flag once none is in force:
    whatever is stored next must be seen again."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(200, 1))
    bucket = lim.keys("resend").bucket
    lim.back_off("resend", 1)
    assert lim.take("resend", "acme").reason == "provider_backoff"
    clock.now += 1_000
    assert lim.take("resend", "acme").granted
    assert redis_client.hget(bucket, "state") is None  # nothing in force: the fast path
    lim.back_off("resend", 2)
    assert lim.take("resend", "acme").wait_ms == 2_000
    clock.now += 2_000
    assert lim.take("resend", "acme").granted
    assert lim.learn("resend", 40) is True
    clock.now += 60_000
    # 40/s with a 2-token bucket, as long as the learned rate holds
    assert [lim.take("resend", "acme").granted for _ in range(3)] == [True, True, False]
    assert redis_client.hget(bucket, "state") is not None
    clock.now += 3_600_000  # the learned rate has lapsed: the setting (10 tokens) again
    assert [lim.take("resend", "acme").granted for _ in range(10)] == [True] * 10
    assert redis_client.hget(bucket, "state") is None
    lim.pause("resend", 5, "daily_quota_exceeded")
    assert lim.take("resend", "acme").reason == "provider_paused"


def test_tenant_bucket_never_expires_before_it_has_refilled(redis_client: redis.Redis) -> None:
    """The tenant key's expiry is renewed only when it would end less than half a second
    after the bucket is full again; an expiry before that would hand a tenant in debt a
    full bucket early."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(1000, 1), tenant=RateLimit(20, 1))
    key = lim.keys("resend").tenant("acme")
    for n in range(60):
        decision = lim.take("resend", "acme", messages=1 + n % 3)
        if not decision.granted:
            clock.now += decision.wait_ms
            continue
        tokens_left = tokens(redis_client, key)
        refill_ms = (20 - tokens_left) / 0.02
        # Redis's TTL runs on real time, slower than this clock: a TTL set from the
        # test's clock only gets longer in its terms, so it must be renewed to pass
        assert redis_client.pttl(key) >= refill_ms + 400
        clock.now += 7


def test_tokens_due_soon_are_reserved_and_later_callers_queue_behind_them(
    redis_client: redis.Redis,
) -> None:
    """A caller that accepts a short wait gets the next token now, due when it refills;
    the next caller's wait counts that token as spent, so no two sends share a slot."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(50, 1))  # 2 tokens, one per 20 ms
    assert [lim.take("resend", "acme", reserve_ms=50).wait_ms for _ in range(2)] == [0, 0]
    first = lim.take("resend", "acme", reserve_ms=50)
    second = lim.take("resend", "acme", reserve_ms=50)
    assert (first.granted, first.reason, first.wait_ms) == (True, "reserved", 20)
    assert (second.granted, second.reason, second.wait_ms) == (True, "reserved", 40)
    # due later than the caller accepts: refused, with nothing taken
    before = tokens(redis_client, lim.keys("resend").bucket)
    third = lim.take("resend", "acme", reserve_ms=50)
    assert (third.granted, third.reason, third.wait_ms) == (False, "provider_rate_limit", 60)
    assert tokens(redis_client, lim.keys("resend").bucket) == before
    assert not lim.take("resend", "acme").granted  # without reserve_ms: refused as before
    # callers every 5 ms: after the full bucket's two, due times one token interval apart
    clock.now += 1_000
    start = clock.now
    due = []
    for _ in range(30):
        decision = lim.take("resend", "acme", reserve_ms=50)
        if decision.granted:
            due.append(clock.now + decision.wait_ms - start)
        clock.now += 5
    assert due == [0, 5, *range(20, 200, 20)]


def test_a_reservation_takes_tenant_tokens_too_and_never_overrides_a_long_tenant_wait(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(1000, 1), tenant=RateLimit(100, 1))
    assert lim.take("resend", "acme", messages=100).granted
    soon = lim.take("resend", "acme", messages=3, reserve_ms=50)
    assert (soon.granted, soon.wait_ms) == (True, 30)  # 3 messages at 100/s
    assert tokens(redis_client, lim.keys("resend").tenant("acme")) == -3
    late = lim.take("resend", "acme", messages=5, reserve_ms=50)
    assert (late.granted, late.reason, late.wait_ms) == (False, "tenant_rate_limit", 80)
    # a back-off is never waited out in process, however short
    lim.back_off("resend", 0.01)
    assert lim.take("resend", "globex", reserve_ms=50).reason == "provider_backoff"


def test_a_refused_send_holds_its_slot_and_later_sends_queue_behind_it(
    redis_client: redis.Redis,
) -> None:
    """Refused within the horizon, a named send takes its tokens and holds the slot they
    are due at; back at that slot it is granted without taking again, while a send that
    arrived in between was refused for the slot after it."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(10, 1))  # 1 token, one per 100 ms
    assert lim.take("resend", "acme").granted
    held = lim.take("resend", "acme", hold_as="job-1:0", hold_ms=2_000)
    assert (held.granted, held.reason, held.wait_ms) == (False, "provider_slot_held", 100)
    assert tokens(redis_client, lim.keys("resend").bucket) == -1
    clock.now += 50
    early = lim.take("resend", "acme", hold_as="job-1:0", hold_ms=2_000)
    assert (early.granted, early.reason, early.wait_ms) == (False, "provider_slot_held", 50)
    # a send arriving meanwhile (unnamed) is refused for the slot after the held one
    assert lim.take("resend", "globex").wait_ms == 150
    clock.now += 50
    assert lim.take("resend", "acme", hold_as="job-1:0", hold_ms=2_000) == Decision(True)
    assert tokens(redis_client, lim.keys("resend").bucket) == -1  # nothing taken twice
    assert redis_client.zcard(lim.keys("resend").held_slots) == 0
    # the slot was used: the same name again is refused like any send (globex held none)
    again = lim.take("resend", "acme", hold_as="job-1:0", hold_ms=2_000)
    assert (again.reason, again.wait_ms) == ("provider_slot_held", 100)
    assert tokens(redis_client, lim.keys("resend").bucket) == -1


def test_held_slots_stay_within_the_horizon_and_lapse_when_late_or_after_a_429(
    redis_client: redis.Redis,
) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(10, 1))
    assert lim.take("resend", "acme").granted
    waits = [lim.take("resend", "acme", hold_as=f"j{n}", hold_ms=300).wait_ms for n in range(5)]
    assert waits == [100, 200, 300, 400, 500]  # the last two are beyond the horizon
    assert redis_client.zcard(lim.keys("resend").held_slots) == 3
    assert lim.take("resend", "acme", hold_as="j3", hold_ms=300).reason == "provider_rate_limit"
    # j0 comes back more than a second after its slot: it has lapsed, tokens again
    clock.now += 1_200
    assert lim.take("resend", "acme", hold_as="j0", hold_ms=300) == Decision(True)
    assert tokens(redis_client, lim.keys("resend").bucket) == 0
    # a 429 empties the bucket and drops the held slots with the tokens they stood for
    lim.back_off("resend", 1)
    assert redis_client.exists(lim.keys("resend").held_slots) == 0
    clock.now += 1_000
    assert lim.take("resend", "acme", hold_as="j1", hold_ms=300) == Decision(True)
    assert lim.take("resend", "acme", hold_as="j2", hold_ms=300).reason == "provider_slot_held"


def test_held_slot_takes_the_tenant_tokens_too(redis_client: redis.Redis) -> None:
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(10, 1), tenant=RateLimit(100, 1))
    assert lim.take("resend", "acme", messages=10).granted
    held = lim.take("resend", "acme", messages=10, hold_as="j", hold_ms=2_000)
    assert held.reason == "provider_slot_held"
    assert tokens(redis_client, lim.keys("resend").tenant("acme")) == 80
    clock.now += 100
    assert lim.take("resend", "acme", messages=10, hold_as="j", hold_ms=2_000).granted
    assert tokens(redis_client, lim.keys("resend").tenant("acme")) == 80
