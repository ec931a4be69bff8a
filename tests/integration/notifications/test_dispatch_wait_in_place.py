"""A transactional send whose token is a few ms away waits for it in place (real Redis and a
Resend-like server on loopback; the limiter's clock is driven by the test, and the
dispatcher's sleep moves that clock instead of sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
from pydantic import SecretStr

from platform_tasks.errors import Throttled
from platform_tasks.notifications.dispatch import WAIT_IN_PLACE_MS, Dispatcher
from platform_tasks.notifications.limiter import RateLimiter
from platform_tasks.notifications.message import EmailMessage
from platform_tasks.notifications.resend import ResendProvider
from platform_tasks.settings.rate_limits import RateLimit
from tests.support.resend_server import API_KEY, ResendLikeServer


class Clock:
    """Milliseconds the test moves by hand."""

    def __init__(self, start: int = 5_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


class DrivenSleep:
    """The dispatcher's sleep: records each wait and moves the clock by it; ``meanwhile``
    runs after each wait (another worker acting while this one waited)."""

    def __init__(self, clock: Clock, meanwhile: object = None) -> None:
        self.clock = clock
        self.waits: list[float] = []
        self.meanwhile = meanwhile

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.now += round(seconds * 1000)
        if callable(self.meanwhile):
            self.meanwhile()


def rig(
    client: redis.Redis,
    server: ResendLikeServer,
    *,
    provider: RateLimit,
    tenant: RateLimit | None = None,
    meanwhile: object = None,
) -> tuple[Dispatcher, RateLimiter, DrivenSleep]:
    clock = Clock()
    limiter = RateLimiter(
        client,
        profile="test",
        provider_limits={"resend": provider},
        tenant_limits={"resend": tenant} if tenant else {},
        clock_ms=clock,
    )
    sleep = DrivenSleep(clock, meanwhile)
    dispatcher = Dispatcher(
        limiter,
        {"resend": lambda: ResendProvider(SecretStr(API_KEY), server.url)},
        clock=lambda: datetime.fromtimestamp(clock.now / 1000, UTC),
        sleep=sleep,
    )
    return dispatcher, limiter, sleep


def receipt(n: int) -> list[EmailMessage]:
    return [
        EmailMessage(
            "Shop <shop@example.com>", f"user{n}@example.org", f"Receipt {n}", text="thanks"
        )
    ]


def send(
    dispatcher: Dispatcher, n: int, *, rail: str = "transactional", tenant: str = "acme"
) -> list[str]:
    return dispatcher.send(
        provider="resend", rail=rail, tenant_id=tenant, job_id=f"job-{n}", messages=receipt(n)
    ).ids


def test_a_receipt_whose_token_is_21_ms_away_waits_for_it_and_is_sent(
    redis_client: redis.Redis, resend: ResendLikeServer
) -> None:
    dispatcher, _, sleep = rig(redis_client, resend, provider=RateLimit(48, 1))
    try:
        for n in range(3):  # a 48/s bucket holds 2 tokens; the third is 1/48 s away
            assert len(send(dispatcher, n)) == 1
    finally:
        dispatcher.close()
    assert sleep.waits == [0.021]
    keys = [r.idempotency_key for r in resend.snapshot()[0]]
    assert keys == ["job-0:0", "job-1:0", "job-2:0"]


def test_a_marketing_send_is_never_held_in_place(
    redis_client: redis.Redis, resend: ResendLikeServer
) -> None:
    dispatcher, _, sleep = rig(redis_client, resend, provider=RateLimit(48, 1))
    try:
        for n in range(2):
            send(dispatcher, n)
        with pytest.raises(Throttled) as refused:
            send(dispatcher, 2, rail="marketing")
    finally:
        dispatcher.close()
    assert refused.value.reason == "provider_rate_limit"
    assert sleep.waits == []
    assert len(resend.snapshot()[0]) == 2


def test_a_token_further_away_than_the_in_place_limit_goes_round_the_delay_store(
    redis_client: redis.Redis, resend: ResendLikeServer
) -> None:
    dispatcher, _, sleep = rig(redis_client, resend, provider=RateLimit(2, 1))
    try:
        send(dispatcher, 0)  # the one token of a 2/s bucket; the next is 500 ms away
        with pytest.raises(Throttled) as refused:
            send(dispatcher, 1)
    finally:
        dispatcher.close()
    assert WAIT_IN_PLACE_MS < 500
    assert refused.value.reason == "provider_rate_limit"
    assert sleep.waits == []
    assert len(resend.snapshot()[0]) == 1


def test_a_tenant_over_its_limit_is_throttled_without_holding_the_worker(
    redis_client: redis.Redis, resend: ResendLikeServer
) -> None:
    dispatcher, limiter, sleep = rig(
        redis_client, resend, provider=RateLimit(1000, 1), tenant=RateLimit(50, 1)
    )
    assert limiter.take("resend", "acme", messages=50).granted  # acme's whole bucket
    try:
        with pytest.raises(Throttled) as refused:  # acme's next message is 20 ms away
            send(dispatcher, 0)
        assert send(dispatcher, 1, tenant="globex")  # another tenant is not held back
    finally:
        dispatcher.close()
    assert refused.value.reason == "tenant_rate_limit"
    assert sleep.waits == []


def test_waiting_in_place_ends_after_the_limit_when_others_keep_taking_the_token(
    redis_client: redis.Redis, resend: ResendLikeServer
) -> None:
    """Each time this worker has waited, another worker's fresh receipt takes the token."""
    rival: list[RateLimiter] = []

    def another_worker_takes_the_token() -> None:
        assert rival[0].take("resend", "globex").granted

    dispatcher, limiter, sleep = rig(
        redis_client, resend, provider=RateLimit(48, 1), meanwhile=another_worker_takes_the_token
    )
    rival.append(limiter)
    try:
        for n in range(2):
            send(dispatcher, n)
        with pytest.raises(Throttled) as refused:
            send(dispatcher, 2)
    finally:
        dispatcher.close()
    assert refused.value.reason == "provider_rate_limit"
    assert len(sleep.waits) >= 2
    assert sum(sleep.waits) <= WAIT_IN_PLACE_MS / 1000
    assert len(resend.snapshot()[0]) == 2
