"""The two-level rate-limit script against a raw single-key token bucket, in the same run.

Usage: .venv/bin/python bench/notifications_limiter.py [--calls 20000] [--rounds 5]

One private Redis. Both variants are called with ``EVALSHA`` from one client, one call a
round trip (no pipelining), the way a worker calls them:

- ``raw``: a minimal single-key token bucket (HMGET, refill, HSET, one key);
- ``two-level``: ``rate_limit_take.lua`` through ``RateLimiter.take`` (pause check,
  provider bucket with 429 back-off and learned rate, tenant bucket, both or nothing),
  with a tenant limit configured, so both buckets are read and written.

Buckets are sized so every call is granted (the common path). Rounds alternate the order;
the ratio (two-level calls/s ÷ raw calls/s) is taken within each round, and the median
and range of the ratios are printed. Target: ≥ 0.8. On a shared machine wall-clock rates
swing, so CPU per call is printed too: Redis's own (``INFO commandstats`` usec_per_call of
EVALSHA) and the calling process's (``time.process_time``), and the ratio of their sums
(raw ÷ two-level: the share of the raw bucket's speed the two-level script keeps when CPU
is the limit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._servers import bench_redis  # noqa: E402
from platform_tasks.notifications.limiter import RateLimiter  # noqa: E402
from platform_tasks.settings.rate_limits import RateLimit  # noqa: E402

RAW_BUCKET = """
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local tokens = tonumber(v[1]) or cap
local ts = tonumber(v[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
if tokens < 1 then return 0 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'ts', tostring(now))
return 1
"""

BIG = RateLimit(10_000_000, 1)


def run_raw(client: redis.Redis, calls: int) -> float:
    script = client.register_script(RAW_BUCKET)
    rate, cap = repr(BIG.per_second / 1000), repr(BIG.capacity)
    start = time.perf_counter()
    for _ in range(calls):
        script(keys=["bench:raw:bucket"], args=[rate, cap])
    return calls / (time.perf_counter() - start)


def run_two_level(client: redis.Redis, calls: int) -> float:
    limiter = RateLimiter(
        client, profile="bench", provider_limits={"resend": BIG}, tenant_limits={"resend": BIG}
    )
    start = time.perf_counter()
    for n in range(calls):
        if not limiter.take("resend", f"tenant-{n % 50}", messages=1).granted:
            raise AssertionError("the benchmark buckets must always grant")
    return calls / (time.perf_counter() - start)


def measure(client: redis.Redis, run: Any, calls: int) -> tuple[float, float, float]:
    """(calls/s, Redis µs per call, client CPU µs per call) of one variant."""
    client.config_resetstat()
    cpu = time.process_time()
    rate = run(client, calls)
    cpu = time.process_time() - cpu
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return rate, float(stats["usec_per_call"]), cpu / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with bench_redis() as server:
        client = redis.Redis.from_url(server.url)
        run_raw(client, 500)  # warm the connection and the script caches
        run_two_level(client, 500)
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        raws: list[tuple[float, float, float]] = []
        twos: list[tuple[float, float, float]] = []
        for n in range(args.rounds):
            if n % 2 == 0:
                raw = measure(client, run_raw, args.calls)
                two = measure(client, run_two_level, args.calls)
            else:
                two = measure(client, run_two_level, args.calls)
                raw = measure(client, run_raw, args.calls)
            raws.append(raw)
            twos.append(two)
            ratios.append(two[0] / raw[0])
            cpu_ratios.append((raw[1] + raw[2]) / (two[1] + two[2]))
            print(
                f"round {n + 1}: raw {raw[0]:,.0f} calls/s (Redis {raw[1]:.1f} us, client "
                f"{raw[2]:.0f} us), two-level {two[0]:,.0f} calls/s (Redis {two[1]:.1f} us, "
                f"client {two[2]:.0f} us); ratio {ratios[-1]:.2f}, CPU ratio {cpu_ratios[-1]:.2f}"
            )
        print(
            f"median raw {statistics.median(r[0] for r in raws):,.0f} calls/s, two-level "
            f"{statistics.median(t[0] for t in twos):,.0f} calls/s; ratio median "
            f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
            f"CPU ratio median {statistics.median(cpu_ratios):.2f} "
            f"(range {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}); target >= 0.8"
        )
        client.close()


if __name__ == "__main__":
    main()
