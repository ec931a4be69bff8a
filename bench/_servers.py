"""Shared set-up for benchmarks: real servers in a temporary folder, stopped at exit."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from platform_tasks.testing.servers import PostgresServer, RedisServer


@contextlib.contextmanager
def bench_redis() -> Iterator[RedisServer]:
    base = Path(tempfile.mkdtemp(prefix="platform-bench-"))
    os.chmod(base, 0o755)
    server = RedisServer(base / "redis", appendonly=False).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def bench_postgres() -> Iterator[PostgresServer]:
    base = Path(tempfile.mkdtemp(prefix="platform-bench-pg-"))
    os.chmod(base, 0o755)
    server = PostgresServer(base / "pg" / "data").start()
    try:
        yield server
    finally:
        server.stop()
