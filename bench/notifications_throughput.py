"""Notification throughput against a provider limited to N requests/s, with real workers.

Usage: .venv/bin/python bench/notifications_throughput.py [--workers 4] [--concurrency 2]
           [--transactional 2000] [--marketing 20000] [--chunk 100] [--rate 50]
           [--pace 45] [--server-rate N] [--server-nice -10]

One private Redis and PostgreSQL, a Resend-like server on loopback enforcing ``--rate``
requests/s (429 with retry-after beyond it; its threads at ``--server-nice``, -10 by
default: a provider's clock does not stall while the workers load the cores), workers
started as users start them (``celery -A tests.apps.notifications_app worker``, no ``-Q``) with
``PLATFORM_PROVIDER_RATE_LIMITS=resend=<rate>/s``. Two phases, fresh workers each:

1. **transactional only**: ``--transactional`` receipts published at ``--pace``/s;
2. **with marketing**: the same receipts, plus ``--marketing`` recipients published first
   as blasts of ``--chunk`` (the backlog that keeps the provider at its limit).

Printed per phase: achieved provider rate ÷ configured rate over each 10 s window after a
2 s warm-up while the marketing backlog lasts (target ≥ 0.95, and never above 1.05),
provider 429s, transactional latency p50/p99 (publish → the provider received it),
seconds marketing was paused, Redis commands per sent email (every command the server
processed: broker polling, events, delays, rate limits, while idle too) and rate-limit
script calls per sent email, duplicates and dead letters (both must be 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._servers import bench_postgres, bench_redis  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from tests.e2e.notifications.support import rig  # noqa: E402
from tests.support.notification_load import LoadResult, run_load  # noqa: E402
from tests.support.resend_server import ResendLikeServer  # noqa: E402


def phase(
    name: str, redis_url: str, database_url: str, args: argparse.Namespace, marketing: int
) -> LoadResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"notif-bench-{name}-"))
    env = {"PLATFORM_PROVIDER_RATE_LIMITS": f"resend={args.rate}/s"}
    # the provider's clock must not stall with this machine's load (ResendLikeServer.nice)
    server = ResendLikeServer(rate_limit=args.server_rate or args.rate, nice=args.server_nice)
    with rig(
        redis_url,
        database_url,
        workdir,
        workers=args.workers,
        concurrency=args.concurrency,
        env=env,
        server=server,
    ) as r:
        result = run_load(
            r,
            redis_url,
            transactional=args.transactional,
            marketing=marketing,
            chunk_size=args.chunk,
            transactional_per_second=args.pace,
            campaign=name,
            timeout=3600,
        )
    ratios = [rate / args.rate for rate in result.window_rates]
    window = (
        f"min {min(ratios):.3f} median {statistics.median(ratios):.3f} "
        f"max {max(ratios):.3f} over {len(ratios)} windows"
        if ratios
        else "no 10 s window with a backlog"
    )
    print(
        f"[{name}] {result.emails}/{result.expected_emails} emails in {result.requests} "
        f"requests, {result.duration:.1f} s; achieved/configured rate: {window}; "
        f"429s {result.provider_429s}; transactional p50 {result.latency(0.5) * 1000:.0f} ms "
        f"p99 {result.latency(0.99) * 1000:.0f} ms; marketing paused "
        f"{result.paused_seconds:.1f} s in {result.pauses} pause(s); Redis commands/email "
        f"{result.redis_commands / max(1, result.emails):.2f} (rate-limit script calls/email "
        f"{result.limiter_calls / max(1, result.emails):.3f}, per request "
        f"{result.limiter_calls / max(1, result.requests):.3f}; throttled deliveries "
        f"{result.throttles}: {result.throttled_receipts} receipt, "
        f"{result.throttles - result.throttled_receipts} blast); duplicates "
        f"{result.duplicates}; dead letters {result.dead_letters}",
        flush=True,
    )
    if ratios:
        mixed, tail = ratios[: result.mixed_windows], ratios[result.mixed_windows :]
        print(
            f"[{name}] 10 s windows (1 s apart, from warm-up), both rails: "
            f"{' '.join(f'{r:.2f}' for r in mixed)} | marketing only (tail): "
            f"{' '.join(f'{r:.2f}' for r in tail)}",
            flush=True,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--transactional", type=int, default=2000)
    parser.add_argument("--marketing", type=int, default=20000)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument(
        "--rate", type=int, default=50, help="PLATFORM_PROVIDER_RATE_LIMITS=resend=<rate>/s"
    )
    parser.add_argument(
        "--server-rate",
        type=int,
        default=None,
        help="requests/s the provider enforces (default: --rate)",
    )
    parser.add_argument(
        "--pace", type=float, default=45.0, help="transactional receipts published per second"
    )
    parser.add_argument(
        "--server-nice",
        type=int,
        default=-10,
        help="priority of the provider's threads (0: the same as everything else)",
    )
    args = parser.parse_args()
    with bench_redis() as redis_server, bench_postgres() as postgres:
        migrate(postgres.url)
        phase("transactional-only", redis_server.url, postgres.url, args, marketing=0)
        client = redis.Redis.from_url(redis_server.url)
        client.flushall()  # an empty broker and empty buckets for the second phase
        client.close()
        phase("with-marketing", redis_server.url, postgres.url, args, marketing=args.marketing)


if __name__ == "__main__":
    main()
