"""Fan-out against the real servers: an app with the fan-out installed, tenants, queues."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg2
import pytest
import redis

from platform_tasks import QueuePort
from platform_tasks.envelope import Envelope, parse_envelope
from platform_tasks.fanout import FANOUT_QUEUE, FanOutRequest, install
from platform_tasks.fanout.backpressure import QueueBound
from platform_tasks.fanout.consumer import FanOutResult, run_fan_out
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app


def decode(raw: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(wire message, envelope) of one broker list entry."""
    message = json.loads(raw)
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return message, args[0]


def queued(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Envelopes on ``queue``'s list, oldest first (without removing them)."""
    return [decode(raw)[1] for raw in reversed(client.lrange(queue, 0, -1))]


def add_tenants(
    database_url: str, rows: Sequence[tuple[str, str]] | Sequence[tuple[str, str, bool]]
) -> None:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            for row in rows:
                active = row[2] if len(row) > 2 else True  # type: ignore[misc]
                cur.execute(
                    "INSERT INTO core.tenants (tenant_id, freshness_tier, active) "
                    "VALUES (%s, %s, %s) ON CONFLICT (tenant_id) DO UPDATE "
                    "SET freshness_tier = excluded.freshness_tier, active = excluded.active",
                    (row[0], row[1], active),
                )
    finally:
        conn.close()


class FanOutHarness:
    """The app, its queue port and a way to run the fan-out jobs waiting on the queue."""

    def __init__(self, settings: PlatformSettings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self.app = create_test_app("fanout_test", settings=settings)
        self.port = QueuePort(self.app)
        install(self.app, self.port)

    def pending_fan_outs(self) -> list[Envelope[Any]]:
        envelopes = []
        while (raw := self.client.rpop(FANOUT_QUEUE)) is not None:
            envelopes.append(parse_envelope(decode(raw)[1], FanOutRequest))  # type: ignore[arg-type]
        return envelopes

    def run(
        self,
        envelope: Envelope[Any],
        settings: PlatformSettings | None = None,
        bound: QueueBound | None = None,
    ) -> FanOutResult:
        return run_fan_out(self.app, envelope, settings=settings or self.settings, bound=bound)

    def run_pending(self) -> list[FanOutResult]:
        return [self.run(envelope) for envelope in self.pending_fan_outs()]

    def close(self) -> None:
        self.port.close()


@pytest.fixture
def harness(settings: PlatformSettings, redis_client: redis.Redis) -> Iterator[FanOutHarness]:
    h = FanOutHarness(settings, redis_client)
    yield h
    h.close()
