"""A scaled-down throughput run: 2 workers, 200 transactional receipts and 2,000 marketing
emails against a provider limited to 50 requests/s (``bench/notifications_throughput.py``
runs the full size). Marketing goes in blasts of 4 recipients a request so the provider
is kept busy for more than one 10 s window after warm-up.

The test holds what the limiter guarantees whatever the machine's speed: no 10 s window
above the limit (+5 %), every email exactly once, nothing dead-lettered for throttling.
How close the rate comes to the limit depends on spare CPU, so that ratio is measured by
the benchmark (``bench/notifications_throughput.py``), not asserted here."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.notifications.support import rig
from tests.support.notification_load import run_load
from tests.support.resend_server import ResendLikeServer

RATE = 50


def test_rate_holds_at_the_limit_and_every_email_arrives_once(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": f"resend={RATE}/s"}
    server = ResendLikeServer(rate_limit=RATE)
    with rig(redis_url, database_url, tmp_path, workers=2, env=env, server=server) as r:
        result = run_load(
            r,
            redis_url,
            transactional=200,
            marketing=2000,
            chunk_size=4,
            transactional_per_second=10,
        )
    print(
        f"\nwindows req/s: {[round(x, 1) for x in result.window_rates]}; "
        f"429s {result.provider_429s}; transactional p50 {result.latency(0.5):.3f} s "
        f"p99 {result.latency(0.99):.3f} s; paused {result.paused_seconds:.1f} s; "
        f"Redis commands/email {result.redis_commands / result.emails:.2f}"
    )
    assert result.emails == result.expected_emails == 2200
    assert result.duplicates == 0
    assert result.dead_letters == 0
    assert result.window_rates, "the backlog did not last one 10 s window after warm-up"
    assert max(result.window_rates) <= RATE * 1.05, result.window_rates
