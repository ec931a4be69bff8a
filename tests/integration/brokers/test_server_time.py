"""Redis server time, read one way by every stage (a cluster's per-node reply is in
tests/integration/limits/test_limits_cluster.py, which starts the cluster)."""

from __future__ import annotations

import redis

from platform_tasks.brokers.server_time import redis_now_ms, redis_time, reply_ms


def test_milliseconds_seconds_and_a_pipelined_reply_read_the_same_clock(
    redis_client: redis.Redis,
) -> None:
    first = redis_now_ms(redis_client)
    seconds = redis_time(redis_client)
    with redis_client.pipeline(transaction=False) as pipe:
        pipe.time()
        (reply,) = pipe.execute()
    last = reply_ms(reply)
    assert first > 1_700_000_000_000
    assert first <= seconds * 1000 < last + 1  # ms are whole: the same ms reads as less
    assert last - first < 60_000
