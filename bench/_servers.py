"""Shared set-up for benchmarks: real servers in a temporary folder, stopped at exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
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
        shutil.rmtree(base, ignore_errors=True)


class _ConfiguredPostgres(PostgresServer):
    """The harness's PostgreSQL with more settings (``shared_preload_libraries``...)."""

    def __init__(self, data_dir: Path, options: Mapping[str, str]) -> None:
        super().__init__(data_dir)
        self.options = dict(options)

    def argv(self) -> list[str]:
        extra = [arg for key, value in self.options.items() for arg in ("-c", f"{key}={value}")]
        return [*super().argv(), *extra]


@contextlib.contextmanager
def bench_postgres(options: Mapping[str, str] | None = None) -> Iterator[PostgresServer]:
    """A PostgreSQL for one bench run; ``options``: settings beyond the harness's."""
    base = Path(tempfile.mkdtemp(prefix="platform-bench-pg-"))
    os.chmod(base, 0o755)
    data = base / "pg" / "data"
    server = (_ConfiguredPostgres(data, options) if options else PostgresServer(data)).start()
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
