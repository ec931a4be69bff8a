"""Where the time of the full waiting-message search goes (``find_messages.lua``).

Usage: .venv/bin/python bench/job_status_scan.py [--waiting 100000] [--queues 4] [--rounds 7]

An id no store has, and every ``jobs list --correlation-id``, make the search read every
waiting message into the server's Lua (nothing is written at publish to find a job later).
This script fills one private Redis as ``bench/job_status_latency.py`` does (real wire
messages over ``--queues`` queues) and times, in alternating order within each round,
scripts that read all of them:

- ``lpos``: ``LPOS`` of an absent message over every list: Redis's own C loop over every
  message, nothing copied (what a search would cost if Redis could match a substring);
- ``hscan 250``: the same messages read from a hash with ``HSCAN`` (as the search reads
  kombu's unacked hash and the delay store's entries), 250 per call;
- ``read N``: ``LRANGE`` in chunks of N messages and nothing else: the floor any search in
  Lua pays (Redis builds each chunk's reply, Lua copies every message into a string);
- ``find id`` / ``find corr``: the same read plus one plain ``string.find`` per message
  for an absent job id (a UUIDv4: no time to bisect on) or correlation ending;
- ``anchor id`` / ``anchor corr``: the find starting with the needle's part from its first
  character that a base64 body lacks (``-`` in a job id, ``=`` before a correlation id),
  the whole needle checked only where that part is found;
- ``script id`` / ``script corr``: ``find_messages.lua`` itself, at the search's chunk
  (``redis_search.CHUNK``) and, for the id, at 250 and 1,000.

With ``--sizes 100,400,1560,6000`` it then times ``read 250`` over as many messages of
random hex text of each size instead (is the read's cost per message or per byte?).

The baseline, in the same round: ``read 1000`` (the chunk the search used before 250).
Printed per variant: median and min over the rounds, µs per message, and the median's
ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from job_status_latency import fill_redis  # noqa: E402

from platform_tasks.brokers.scripts import script_source  # noqa: E402
from platform_tasks.jobs_status.redis_search import CHUNK, anchor_of, wire_text  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.testing.servers import RedisServer  # noqa: E402

SCAN = """
local chunk, a, b = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local find, n = string.find, 0
for _, k in ipairs(KEYS) do
  local len, s = redis.call('LLEN', k), 0
  while s < len do
    local items = redis.call('LRANGE', k, s, s + chunk - 1)
    for i = 1, #items do
      local it = items[i]
      %s
    end
    s = s + chunk
  end
end
return n
"""
READ = SCAN % "n = n + 1"
HSCAN = """
local cursor, n = '0', 0
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', tonumber(ARGV[1]))
  cursor = page[1]
  n = n + #page[2] / 2
until cursor == '0'
return n
"""
LPOS = """
local n = 0
for _, k in ipairs(KEYS) do
  n = n + (redis.call('LPOS', k, ARGV[1], 'MAXLEN', 0) or 0)
end
return n
"""
FIND = SCAN % "if find(it, a, 1, true) then n = n + 1 end"
ANCHOR = SCAN % "if find(it, a, 1, true) and find(it, b, 1, true) then n = n + 1 end"


def by_size(client: redis.Redis, size: int, count: int, rounds: int) -> None:
    """``read 250`` over ``count`` messages of ``size`` bytes of random hex text."""
    client.delete("sized")
    pipe = client.pipeline(transaction=False)
    for index in range(count):
        pipe.lpush("sized", os.urandom(size // 2).hex())
        if index % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    script = client.register_script(READ)
    times = []
    for round_ in range(rounds + 1):
        started = time.perf_counter()
        script(keys=["sized"], args=[250, "", ""])
        if round_:
            times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    print(
        f"read 250, {size:>5} B each    median {median:7.1f} ms  min {min(times):7.1f} ms  "
        f"{median * 1000 / count:5.2f} µs/message",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="", help="e.g. 100,400,1560,6000 (bytes)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-status-scan-"))
    rs = RedisServer(base / "redis").start()
    try:
        settings = PlatformSettings.build(
            redis_url=rs.url, database_url="postgresql://unused/unused", profile="bench"
        )
        queues = [f"queue{i}" for i in range(args.queues)]
        fill_redis(settings, args.waiting, queues)
        client = redis.Redis.from_url(rs.url)
        size = statistics.mean(len(client.lindex(q, 0) or b"") for q in queues)
        print(f"{args.waiting:,} waiting messages of {size:.0f} bytes over {args.queues} queues")
        for queue in queues:  # the same messages in a hash, for the hscan variant
            messages = client.lrange(queue, 0, -1)
            for start in range(0, len(messages), 5000):
                batch = messages[start : start + 5000]
                client.hset(
                    "as_hash", mapping={f"{queue}:{start + i}": m for i, m in enumerate(batch)}
                )
        job = str(uuid.uuid4())
        corr = wire_text(" correlation_id=absent-correlation-id)")
        script = script_source("find_messages")
        variants: dict[str, tuple[str, list[Any]]] = {
            "lpos": (LPOS, ["absent"]),
            "hscan 250": (HSCAN, [250]),
            **{f"read {n}": (READ, [n, "", ""]) for n in (100, 250, 500, 1000, 2000)},
            "find id, chunk 1000": (FIND, [1000, job, ""]),
            "find corr, chunk 1000": (FIND, [1000, corr, ""]),
            **{
                f"anchor id, chunk {n}": (ANCHOR, [n, anchor_of(job), job])
                for n in (250, 500, 1000)
            },
            "anchor corr, chunk 500": (ANCHOR, [500, anchor_of(corr), corr]),
            **{
                f"script id, chunk {n}": (script, [job, anchor_of(job), 1, n, "", 300])
                for n in sorted({250, 1000, CHUNK})
            },
            f"script corr, chunk {CHUNK}": (
                script,
                [corr, anchor_of(corr), 10_000, CHUNK, "", 300],
            ),
        }
        scripts = {name: client.register_script(src) for name, (src, _) in variants.items()}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.rounds + 1):
            order = list(variants) if round_ % 2 else list(reversed(variants))
            for name in order:
                started = time.perf_counter()
                keys = ["as_hash"] if name.startswith("hscan") else queues
                scripts[name](keys=keys, args=variants[name][1])
                if round_:  # round 0 warms (scripts loaded, memory touched)
                    times[name].append((time.perf_counter() - started) * 1000)
        baseline = statistics.median(times["read 1000"])
        for name, samples in times.items():
            median = statistics.median(samples)
            print(
                f"{name:<24} median {median:7.1f} ms  min {min(samples):7.1f} ms  "
                f"{median * 1000 / args.waiting:5.2f} µs/message  "
                f"{median / baseline:5.2f}x read 1000",
                flush=True,
            )
        for size in [int(n) for n in args.sizes.split(",") if n.strip()]:
            by_size(client, size, args.waiting, args.rounds)
    finally:
        rs.stop()


if __name__ == "__main__":
    main()
