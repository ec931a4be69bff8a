"""The Redis sink's hand-packed ``LPUSH``: byte for byte what redis-py would send."""

from __future__ import annotations

import redis

from platform_tasks.publishing.outbox_sinks import lpush_command


def test_lpush_command_is_the_resp_redis_py_packs() -> None:
    values = [b"", b"plain", "caf\u00e9 \r\n $3 *".encode(), bytes(range(256)) * 30]
    packed = b"".join(redis.Connection().pack_command("LPUSH", "celery\x06\x163", *values))
    assert lpush_command("celery\x06\x163", values) == packed
