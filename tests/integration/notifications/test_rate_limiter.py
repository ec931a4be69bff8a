"""The two-level token bucket script against a real Redis, time driven by an explicit clock."""

from __future__ import annotations

import random

import redis
from redis.cluster import key_slot

from platform_tasks.notifications.limiter import TRANSACTIONAL_QUIET_MS, RateLimiter
from platform_tasks.settings.rate_limits import RateLimit


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
    assert lim.take("resend", "acme").granted  # transactional is sending
    clock.now += 21  # one refill (1/48 s): the bucket is full again
    assert lim.take("resend", "acme", rail="marketing").granted
    assert not lim.take("resend", "acme", rail="marketing").granted
    assert lim.take("resend", "acme").granted


def test_after_a_quiet_transactional_second_marketing_may_use_the_whole_bucket(
    redis_client: redis.Redis,
) -> None:
    """The headroom is for a transactional rail that is sending. Once no transactional
    take came for TRANSACTIONAL_QUIET_MS, marketing takes the last token too, and the
    headroom is back with the next transactional take."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(48, 1))  # 2 tokens
    assert lim.take("resend", "acme").granted
    clock.now += TRANSACTIONAL_QUIET_MS  # exactly the quiet time: headroom still kept
    assert lim.take("resend", "acme", rail="marketing").granted
    assert not lim.take("resend", "acme", rail="marketing").granted
    clock.now += 1  # now quiet for longer than that
    assert lim.take("resend", "acme", rail="marketing").granted
    assert not lim.take("resend", "acme", rail="marketing").granted  # the bucket is empty
    refused = lim.take("resend", "acme")  # transactional waits one refill at most
    assert not refused.granted and 0 < refused.wait_ms <= 21
    clock.now += refused.wait_ms
    assert lim.take("resend", "acme").granted
    clock.now += 42  # full again, transactional sending: the headroom is back
    assert lim.take("resend", "acme", rail="marketing").granted
    assert not lim.take("resend", "acme", rail="marketing").granted


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
    assert lim.take("resend", "acme").granted  # transactional is sending
    clock.now += 5  # one refill: the 10-token bucket is full again
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


def test_both_rails_together_keep_the_provider_at_its_rate(redis_client: redis.Redis) -> None:
    """Transactional sends paced just below the limit (45/s of 48/s) while a marketing
    backlog keeps asking (52 tries a second, jittered): the provider must still get its
    whole rate. Marketing takes only what transactional leaves, but it must take it
    before the bucket is full: a full bucket's refill is lost for good."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(48, 1))  # 2 tokens
    rng = random.Random(7)
    events = [(round(i * 1000 / 45), "transactional") for i in range(450)]
    events += [(round(i * 1000 / 52) + rng.randrange(0, 8), "marketing") for i in range(520)]
    start = clock.now
    granted = {"transactional": 0, "marketing": 0}
    for at, rail in sorted(events):
        clock.now = start + at
        if lim.take("resend", "acme", rail=rail).granted:
            granted[rail] += 1
    # 10 s at 48/s plus the 2 tokens the bucket starts with
    assert granted["transactional"] + granted["marketing"] >= 0.97 * 482, granted
    # transactional keeps its priority: almost every receipt finds its token at once
    assert granted["transactional"] >= 0.95 * 450, granted


def most_in_one_second(times: list[int]) -> int:
    """The most of ``times`` (ms, sorted) that fall in any half-open 1000 ms window."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - 1000:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_no_second_is_granted_more_requests_than_the_rate(redis_client: redis.Redis) -> None:
    """A provider counting requests in a sliding second sees at most the setting's count
    from the limiter, bursts included, so the requests' trip there has slack for jitter:
    a 48/s setting against a 50/s provider leaves two requests to spare in every second,
    where rate + burst (48 + 2) left none. Callers ask every millisecond for 3 s."""
    clock = Clock()
    lim = limiter(redis_client, clock, provider=RateLimit(48, 1))
    start = clock.now
    granted: list[int] = []
    for ms in range(3000):
        clock.now = start + ms
        for rail in ("transactional", "marketing"):
            if lim.take("resend", "acme", rail=rail).granted:
                granted.append(ms)
    assert most_in_one_second(granted) == 48
    assert len(granted) >= 3 * 48  # the long-run rate is still the setting's
