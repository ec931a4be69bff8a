"""Throttled notification jobs are due at the rate limits' time (Redis ``TIME``), not the
worker's: the delay store promotes by Redis time, so a due time from a worker clock that
is behind comes too early, and the job is refused again as soon as it is back.

The real consumer pipeline in process, real Redis and PostgreSQL, the Resend-like server.
The worker's clock is the dispatcher's ``clock`` seam, set 30 s behind.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import redis

from platform_tasks.keys import delay_keys
from platform_tasks.notifications import setup
from platform_tasks.notifications.dispatch import Dispatcher
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.integration.notifications.test_notification_task import make_rails, payload
from tests.support.resend_server import ResendLikeServer


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_throttled_job_is_due_when_the_bucket_says_with_the_worker_clock_30_s_behind(
    settings: PlatformSettings,
    resend: ResendLikeServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """20 messages a minute per tenant: after a chunk of 20, the next message's token is
    3 s away. 30 s behind, the worker would have made it due 27 s ago."""
    rails = make_rails(
        settings, resend, tenant_rate_limits="resend=20/min", provider_rate_limits="resend=1000/s"
    )
    try:
        usual = setup.dispatcher_for(rails.app)
        setup.dispatchers.set(
            rails.app,
            Dispatcher(
                usual.limiter,
                {"resend": lambda: usual.provider("resend")},
                clock=lambda: datetime.now(UTC) - timedelta(seconds=30),
            ),
        )
        store = DelayStore(redis_client, delay_keys("test"))
        full = payload("shop.blast", {"recipients": [f"r{n}@example.org" for n in range(20)]})
        late = payload("shop.blast", {"recipients": ["late@example.org"]})
        assert rails.apply(rails.blast, full).state == "SUCCESS"
        with caplog.at_level(logging.WARNING, logger="platform_tasks.notifications"):
            assert rails.apply(rails.blast, late).state == "RETRY"
        assert [r.skew_seconds for r in caplog.records if hasattr(r, "skew_seconds")] == [
            pytest.approx(-30, abs=2)
        ]

        assert store.pending() == 1, "the throttled job was not held back (due at once)"
        ((_, due),) = redis_client.zrange(delay_keys("test").schedule, 0, 0, withscores=True)
        assert 2_000 <= due - _redis_ms(redis_client) <= 3_100  # the bucket's next token

        wait_until(lambda: store.promote_due().moved == 1, timeout=30, message="the promotion")
        assert _redis_ms(redis_client) >= due
        assert rails.apply(rails.blast, late).state == "SUCCESS"  # its token is there now
        assert store.pending() == 0
        _, emails = resend.snapshot()
        assert [e.to for e in emails].count(["late@example.org"]) == 1
    finally:
        rails.app.close()
