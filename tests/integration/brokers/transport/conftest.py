"""Kombu connections on the platform transport (and the stock one, for reference)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection

from platform_tasks.brokers.transport import TRANSPORT_PATH
from tests.support.processes import FAIR_SWITCH

ConnectionFactory = Callable[..., Connection]


@pytest.fixture
def connect(redis_url: str) -> Iterator[ConnectionFactory]:
    """Open kombu connections to the test Redis; all are closed at teardown.

    ``connect(stock=True)`` gives kombu's own Redis transport for comparisons.
    """
    opened: list[Connection] = []

    def factory(*, stock: bool = False, url: str | None = None, **options: Any) -> Connection:
        transport = None if stock else TRANSPORT_PATH
        fair = os.environ.get(FAIR_SWITCH)
        if fair and not stock:
            options.setdefault("fair_queues", [fair])
        conn = Connection(url or redis_url, transport=transport, transport_options=options)
        opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        conn.release()
