"""Blast chunks through the real consumer pipeline (in process), PostgreSQL, Redis and the
Resend-like loopback server: per-recipient claims, and the publisher's back-pressure."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
import redis
from pydantic import BaseModel

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import parse_envelope, uuid7
from platform_tasks.errors import ConfigurationError
from platform_tasks.notifications import EmailMessage, NotificationTask, publish_blast
from platform_tasks.notifications.blast_recipients import claim_recipients
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.resend_server import API_KEY, ResendLikeServer


class Chunk(BaseModel):
    recipients: list[str]
    campaign_id: str
    chunk: int = 0


class Blast:
    def __init__(self, settings: PlatformSettings, server: ResendLikeServer) -> None:
        values = settings.model_dump()
        values.update(
            resend_api_key=API_KEY, resend_base_url=server.url, provider_rate_limits="resend=1000/s"
        )
        self.app = create_app("blast_it", settings=PlatformSettings.build(**values))
        self.server = server
        self.rendered: list[list[str]] = []
        self.fail_render = False

        @self.app.task(
            base=NotificationTask,
            data_model=Chunk,
            name="shop.news",
            rail="marketing",
            shared=False,
        )
        def news(envelope: Any, tx: Any) -> list[EmailMessage]:
            self.rendered.append(list(envelope.data.recipients))
            if self.fail_render:
                raise RuntimeError("template broken")
            return [
                EmailMessage("news@example.com", r, "News", html="<p>hi</p>")
                for r in envelope.data.recipients
            ]

        self.task = news

    def run(self, recipients: list[str], campaign: str = "spring") -> str:
        payload = {
            "job_id": str(uuid7()),
            "tenant_id": "acme",
            "correlation_id": "c-1",
            "kind": "shop.news",
            "data": {"campaign_id": campaign, "recipients": recipients},
        }
        result = self.task.apply(
            args=(payload,), routing_key=self.task.queue, headers={"platform_attempt": 1}
        )
        return str(result.state)

    def received(self) -> Counter[str]:
        _, emails = self.server.snapshot()
        return Counter(r for e in emails for r in e.to)


@pytest.fixture
def blast(settings: PlatformSettings, resend: ResendLikeServer) -> Iterator[Blast]:
    b = Blast(settings, resend)
    yield b
    b.app.close()


def test_a_chunk_sends_only_to_recipients_its_campaign_has_not_reached(blast: Blast) -> None:
    assert blast.run(["a@x.org", "b@x.org"]) == "SUCCESS"
    assert blast.run(["B@x.org", "c@x.org", "c@x.org"]) == "SUCCESS"
    assert blast.run(["c@x.org", "a@x.org"]) == "SUCCESS"  # everyone reached: no render
    assert blast.rendered == [["a@x.org", "b@x.org"], ["c@x.org"]]
    assert blast.received() == Counter({"a@x.org": 1, "b@x.org": 1, "c@x.org": 1})
    assert blast.run(["a@x.org"], campaign="summer") == "SUCCESS"  # another campaign
    assert blast.received()["a@x.org"] == 2


def test_a_failed_send_releases_its_claims(blast: Blast) -> None:
    blast.fail_render = True
    assert blast.run(["a@x.org", "b@x.org"]) == "RETRY"
    blast.fail_render = False
    assert blast.run(["b@x.org", "a@x.org"]) == "SUCCESS"  # a new chunk job, same people
    assert blast.received() == Counter({"a@x.org": 1, "b@x.org": 1})


def test_overlapping_claims_wait_for_each_other(database_url: str) -> None:
    """Two chunk jobs claiming overlapping recipients at once: the second waits on the
    first's uncommitted rows and, once it commits, keeps only the recipients it was first to."""

    def envelope(recipients: list[str]) -> Any:
        payload = {
            "job_id": str(uuid7()),
            "tenant_id": "acme",
            "correlation_id": "c",
            "kind": "shop.news",
            "data": {"campaign_id": "spring", "recipients": recipients},
        }
        return parse_envelope(payload, Chunk)

    first = psycopg2.connect(database_url)
    second = psycopg2.connect(database_url, application_name="second claimer")
    kept: list[Any] = []
    try:
        with first.cursor() as tx:
            assert claim_recipients(envelope(["a@x.org", "b@x.org"]), tx) is not None

            def claim_second() -> None:
                with second, second.cursor() as tx2:
                    kept.append(claim_recipients(envelope(["c@x.org", "b@x.org"]), tx2))

            thread = threading.Thread(target=claim_second)
            thread.start()
            watcher = psycopg2.connect(database_url)
            watcher.autocommit = True

            def second_waits() -> bool:
                with watcher.cursor() as cur:
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = 'second claimer' AND wait_event_type = 'Lock'"
                    )
                    return int(cur.fetchone()[0]) == 1

            wait_until(second_waits, timeout=30, message="the second claim waiting")
            watcher.close()
            first.commit()
            thread.join(timeout=30)
            assert not thread.is_alive()
    finally:
        first.close()
        second.close()
    (result,) = kept
    assert result.data.recipients == ["c@x.org"]


def test_publisher_waits_while_its_bound_of_jobs_is_unsettled(
    settings: PlatformSettings, redis_url: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No worker runs: each time the publisher waits, exactly ``max_in_flight`` of its jobs
    are queued and unsettled; the wait settles one (an idempotency row, as a consumer
    writes it) and the publisher goes on once PostgreSQL shows it."""
    app = create_app("blast_publisher", settings=settings)
    port = QueuePort(app)
    client = redis.Redis.from_url(redis_url)
    settled: list[str] = []
    unsettled_at_wait: list[int] = []

    def consume_one(seconds: float) -> None:
        unsettled = [job for job in queued_jobs(client) if job not in settled]
        unsettled_at_wait.append(len(unsettled))
        settle(database_url, unsettled[:1])
        settled.extend(unsettled[:1])

    caplog.set_level(logging.INFO, logger="platform_tasks.notifications.blasts")
    try:
        ids = publish_blast(
            port,
            kind="shop.news",
            tenant_id="acme",
            campaign_id="spring",
            recipients=[f"r{n}@x.org" for n in range(50)],
            chunk_size=10,
            max_in_flight=2,
            sleep=consume_one,
        )
        assert len(ids) == 5
        assert unsettled_at_wait == [2, 2, 2]
        assert [str(job) for job in ids] == queued_jobs(client)
        events = [getattr(r, "event", None) for r in caplog.records]
        assert events.count("notifications.blast_waiting") == 1  # the first wait only
        assert events.count("notifications.blast_published") == 1
    finally:
        port.close()
        app.close()
        client.close()


def test_publisher_without_a_database_at_its_bound_names_the_setting(
    settings: PlatformSettings, redis_url: str
) -> None:
    app = create_app("blast_publisher", settings=settings.model_copy(update={"database_url": None}))
    port = QueuePort(app)
    try:
        with pytest.raises(ConfigurationError, match="PLATFORM_DATABASE_URL"):
            publish_blast(
                port,
                kind="shop.news",
                tenant_id="acme",
                campaign_id="spring",
                recipients=[f"r{n}@x.org" for n in range(3)],
                chunk_size=1,
                max_in_flight=2,
            )
    finally:
        port.close()
        app.close()


def queued_jobs(client: redis.Redis) -> list[str]:
    """Job ids in the marketing queue, oldest first (kombu pushes on the left)."""
    bodies = [json.loads(raw) for raw in client.lrange("notif.email.marketing", 0, -1)]
    return [body["headers"]["id"] for body in reversed(bodies)]


def settle(database_url: str, job_ids: list[str]) -> None:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            for job_id in job_ids:
                cur.execute(
                    "INSERT INTO core.processed_jobs (job_id, consumer) VALUES (%s, 'test')",
                    (job_id,),
                )
    finally:
        conn.close()
