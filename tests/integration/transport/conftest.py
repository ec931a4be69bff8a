"""Kombu connections on the platform transport (and the stock one, for reference)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection

from platform_tasks.brokers.transport import TRANSPORT_PATH

ConnectionFactory = Callable[..., Connection]


@pytest.fixture
def connect(redis_url: str) -> Iterator[ConnectionFactory]:
    """Open kombu connections to the test Redis; all are closed at teardown.

    ``connect(stock=True)`` gives kombu's own Redis transport for comparisons.
    """
    opened: list[Connection] = []

    def factory(*, stock: bool = False, url: str | None = None, **options: Any) -> Connection:
        transport = None if stock else TRANSPORT_PATH
        conn = Connection(url or redis_url, transport=transport, transport_options=options)
        opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        conn.release()
