"""NotificationTask through the real consumer pipeline (in process), Redis, PostgreSQL and
a Resend-like loopback server: render, tokens, send, and every "not now" as Throttled."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg2
import pytest
import redis
from pydantic import BaseModel

from platform_tasks import create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.envelope import uuid7
from platform_tasks.errors import ConfigurationError
from platform_tasks.keys import delay_keys
from platform_tasks.notifications import EmailMessage, NotificationTask
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import ServerFactory
from tests.support.connections import established_to
from tests.support.resend_server import API_KEY, ResendLikeServer

TRANSACTIONAL = "notif.email.transactional"
MARKETING = "notif.email.marketing"


class Receipt(BaseModel):
    email: str


class Chunk(BaseModel):
    recipients: list[str]


@dataclass
class Rails:
    app: PlatformCelery
    receipt: Any
    blast: Any
    database_url: str
    rendered_blasts: list[int]
    """The chunk size of every run of the blast's render handler."""

    def apply(self, task: Any, payload: dict[str, Any], *, attempt: int = 1) -> Any:
        return task.apply(
            args=(payload,), routing_key=task.queue, headers={"platform_attempt": attempt}
        )

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()


def payload(kind: str, data: dict[str, Any], tenant: str = "acme") -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": tenant,
        "correlation_id": "c-1",
        "kind": kind,
        "data": data,
    }


def make_rails(settings: PlatformSettings, server: ResendLikeServer, **overrides: Any) -> Rails:
    values = settings.model_dump()
    values.update(resend_api_key=API_KEY, resend_base_url=server.url, **overrides)
    rendered_blasts: list[int] = []
    app = create_app("notif_it", settings=PlatformSettings.build(**values))

    @app.task(base=NotificationTask, data_model=Receipt, name="shop.receipt", shared=False)
    def receipt(envelope: Any, tx: Any) -> EmailMessage:
        tx.execute("SELECT 1")
        return EmailMessage(
            "Shop <shop@example.com>", envelope.data.email, "Your receipt", text="thanks"
        )

    @app.task(
        base=NotificationTask, data_model=Chunk, name="shop.blast", rail="marketing", shared=False
    )
    def blast(envelope: Any, tx: Any) -> list[EmailMessage]:
        rendered_blasts.append(len(envelope.data.recipients))
        return [
            EmailMessage("news@example.com", r, "News", html="<p>hi</p>")
            for r in envelope.data.recipients
        ]

    return Rails(app, receipt, blast, str(settings.database_url), rendered_blasts)


@pytest.fixture
def rails(settings: PlatformSettings, resend: ResendLikeServer) -> Iterator[Rails]:
    r = make_rails(settings, resend)
    yield r
    r.app.close()


def delayed(client: redis.Redis) -> list[dict[str, Any]]:
    entries = [json.loads(raw) for raw in client.hvals(delay_keys("test").entries)]
    return [json.loads(entry["m"]) for entry in entries]


def processed(rails: Rails) -> int:
    return len(rails.rows("SELECT job_id FROM core.processed_jobs"))


def test_queue_defaults_to_the_rail(rails: Rails) -> None:
    assert rails.receipt.queue == TRANSACTIONAL
    assert rails.blast.queue == MARKETING


def test_transactional_email_goes_to_emails_once_and_commits(
    rails: Rails, resend: ResendLikeServer
) -> None:
    job = payload("shop.receipt", {"email": "ada@example.org"})
    assert rails.apply(rails.receipt, job).state == "SUCCESS"
    requests, emails = resend.snapshot()
    assert [(r.path, r.idempotency_key) for r in requests] == [("/emails", f"{job['job_id']}:0")]
    assert [e.to for e in emails] == [["ada@example.org"]]
    assert processed(rails) == 1
    assert rails.apply(rails.receipt, job).state == "SUCCESS"  # a redelivery: skipped
    assert len(resend.snapshot()[0]) == 1


def test_closing_the_app_closes_its_provider_connections(
    rails: Rails, resend: ResendLikeServer
) -> None:
    """An app made at run time (a test's) and closed leaves no connection to the provider.

    The provider's HTTP client keeps its connection open between jobs (one TLS handshake per
    worker process, not per email); ``app.close()`` is where a closed app lets go of it.
    """
    job = payload("shop.receipt", {"email": "a@example.org"})
    assert rails.apply(rails.receipt, job).state == "SUCCESS"
    port = urlsplit(resend.url).port
    assert port is not None
    assert len(established_to(port)) == 1
    rails.app.close()
    assert established_to(port) == set()


def test_marketing_chunk_goes_to_the_batch_endpoint(rails: Rails, resend: ResendLikeServer) -> None:
    recipients = [f"r{n}@example.org" for n in range(100)]
    assert rails.apply(rails.blast, payload("shop.blast", {"recipients": recipients})).state == (
        "SUCCESS"
    )
    requests, emails = resend.snapshot()
    assert [r.path for r in requests] == ["/emails/batch"]
    assert sorted(e.to[0] for e in emails) == sorted(recipients)


def test_empty_tenant_bucket_reschedules_without_spending_an_attempt(
    settings: PlatformSettings, resend: ResendLikeServer, redis_client: redis.Redis
) -> None:
    rails = make_rails(
        settings, resend, tenant_rate_limits="resend=1/min", provider_rate_limits="resend=1000/s"
    )
    try:
        first = payload("shop.receipt", {"email": "a@example.org"})
        second = payload("shop.receipt", {"email": "b@example.org"})
        other = payload("shop.receipt", {"email": "c@example.org"}, tenant="globex")
        assert rails.apply(rails.receipt, first).state == "SUCCESS"
        assert rails.apply(rails.receipt, second, attempt=3).state == "RETRY"
        assert rails.apply(rails.receipt, other).state == "SUCCESS"  # globex is not held back
        (wire,) = delayed(redis_client)
        assert wire["headers"]["id"] == second["job_id"]
        assert wire["headers"]["platform_attempt"] == 3  # the same attempt again
        (due,) = redis_client.zrange(delay_keys("test").schedule, 0, 0, withscores=True)
        now_ms = float(redis_client.time()[0]) * 1000
        assert 50_000 <= due[1] - now_ms <= 61_000  # when the tenant bucket has a token
        assert [e.to for e in resend.snapshot()[1]] == [["a@example.org"], ["c@example.org"]]
        assert processed(rails) == 2
        assert rails.rows("SELECT id FROM core.dead_letters") == []
    finally:
        rails.app.close()


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"provider_rate_limits": "resend=1/min"}, "provider"),
        (
            {"provider_rate_limits": "resend=1000/s", "tenant_rate_limits": "resend=150/min"},
            "tenant",
        ),
    ],
)
def test_refused_blast_is_not_rendered(
    settings: PlatformSettings,
    resend: ResendLikeServer,
    redis_client: redis.Redis,
    limits: dict[str, str],
    reason: str,
) -> None:
    """A blast job's recipients are in its envelope, so its tokens (one request, 100
    messages) are taken before the render handler runs: a refused blast costs one script
    call, not 100 rendered emails thrown away."""
    rails = make_rails(settings, resend, **limits)
    try:
        first = payload("shop.blast", {"recipients": [f"a{n}@example.org" for n in range(100)]})
        second = payload("shop.blast", {"recipients": [f"b{n}@example.org" for n in range(100)]})
        assert rails.apply(rails.blast, first).state == "SUCCESS"
        assert rails.apply(rails.blast, second).state == "RETRY"  # {reason} bucket empty
        assert rails.rendered_blasts == [100]  # the refused one never rendered
        (wire,) = delayed(redis_client)
        assert wire["headers"]["id"] == second["job_id"]
        assert len(resend.snapshot()[1]) == 100
        assert processed(rails) == 1
    finally:
        rails.app.close()


def test_provider_429_backs_off_every_sender(
    rails: Rails, resend: ResendLikeServer, redis_client: redis.Redis
) -> None:
    resend.fail_next(429, "rate_limit_exceeded", headers={"retry-after": "3"})
    job = payload("shop.receipt", {"email": "a@example.org"})
    assert rails.apply(rails.receipt, job).state == "RETRY"
    later = payload("shop.receipt", {"email": "b@example.org"})
    assert rails.apply(rails.receipt, later).state == "RETRY"  # refused by the bucket itself
    assert len(resend.snapshot()[0]) == 1
    assert {w["headers"]["platform_attempt"] for w in delayed(redis_client)} == {1}
    assert rails.rows("SELECT id FROM core.dead_letters") == []


def test_quota_429_pauses_the_provider_and_alerts_once(
    rails: Rails,
    resend: ResendLikeServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    resend.exhaust_quota(120)
    caplog.set_level(logging.INFO)
    jobs = [payload("shop.receipt", {"email": f"u{n}@example.org"}) for n in range(3)]
    assert [rails.apply(rails.receipt, job).state for job in jobs] == ["RETRY"] * 3
    alerts = [r for r in caplog.records if getattr(r, "event", "") == "alert.sent"]
    assert len(alerts) == 1
    assert "paused" in alerts[0].getMessage()
    assert len(resend.snapshot()[0]) == 1  # the others never asked the provider
    assert len(delayed(redis_client)) == 3
    assert rails.rows("SELECT id FROM core.dead_letters") == []


def test_validation_error_is_dead_lettered(rails: Rails, resend: ResendLikeServer) -> None:
    resend.fail_next(422, "validation_error", message="Invalid `to` field")
    assert rails.apply(rails.receipt, payload("shop.receipt", {"email": "a@b.org"})).state == (
        "FAILURE"
    )
    ((reason, error),) = rails.rows("SELECT reason, last_error FROM core.dead_letters")
    assert reason == "permanent_error"
    assert "Invalid `to` field" in error
    assert API_KEY not in error


def test_server_error_is_an_ordinary_retry(
    rails: Rails, resend: ResendLikeServer, redis_client: redis.Redis
) -> None:
    resend.fail_next(500, "internal_server_error")
    assert rails.apply(rails.receipt, payload("shop.receipt", {"email": "a@b.org"})).state == (
        "RETRY"
    )
    (wire,) = delayed(redis_client)
    assert wire["headers"]["platform_attempt"] == 2


def test_declaration_errors_name_the_option(rails: Rails) -> None:
    def declare(**options: Any) -> None:
        @rails.app.task(base=NotificationTask, name="shop.bad", lazy=False, shared=False, **options)
        def bad(envelope: Any, tx: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="rail 'bulk'"):
        declare(rail="bulk")
    with pytest.raises(ConfigurationError, match="PLATFORM_NOTIFICATION_CHANNELS"):
        declare(channel="sms")
    with pytest.raises(ConfigurationError, match="PLATFORM_PROVIDER_RATE_LIMITS"):
        declare(provider="twilio")
    with pytest.raises(ConfigurationError, match="unknown task option 'colour'"):
        declare(colour="blue")


def test_blast_chunk_is_not_sent_again_after_the_provider_forgot_its_key(
    rails: Rails, resend: ResendLikeServer
) -> None:
    from platform_tasks.notifications.blasts import blast_job_id

    recipients = [f"r{n}@example.org" for n in range(5)]
    job = payload("shop.blast", {"recipients": recipients})
    job["job_id"] = str(blast_job_id("acme", "spring", recipients))
    assert rails.apply(rails.blast, job).state == "SUCCESS"
    resend.forget_keys()  # 24 hours later the provider would send it again
    assert rails.apply(rails.blast, job).state == "SUCCESS"
    requests, emails = resend.snapshot()
    assert len(requests) == 1
    assert sorted(e.to[0] for e in emails) == recipients


def test_rate_limits_redis_refusing_makes_the_job_wait_without_spending_an_attempt(
    settings: PlatformSettings, resend: ResendLikeServer, server_factory: ServerFactory
) -> None:
    """Redis answers the delivery count but not the rate-limit script, as when it restarts
    between the two calls (here an ACL refuses scripts until the test allows them again).

    Needs a private Redis (``server_factory``): the test changes its ACL. Before the fix the
    limiter's Redis error was judged like a handler's error: attempt 1 counted as failed
    and retried, and after a quick enough restart a redelivery dead-lettered the job."""
    server = server_factory.redis()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command(
        "ACL", "SETUSER", "app", "on", ">app-secret", "~*", "+@all", "-@scripting"
    )
    app_url = server.url.replace("redis://", "redis://app:app-secret@", 1)
    private = settings.model_copy(update={"redis_url": app_url, "broker_url": app_url})
    rails = make_rails(private, resend)
    waiting = threading.Event()

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "event", None) == "consumer.waiting_for_servers":
                waiting.set()

    handler = Waiting()
    logging.getLogger().addHandler(handler)
    box: dict[str, Any] = {}
    job = payload("shop.receipt", {"email": "ada@example.org"})
    thread = threading.Thread(
        target=lambda: box.setdefault("result", rails.apply(rails.receipt, job)), daemon=True
    )
    try:
        thread.start()
        wait_until(
            lambda: waiting.is_set() or not thread.is_alive(),
            timeout=60,
            message="the delivery waits or ends",
        )
        assert thread.is_alive(), f"settled while Redis refused the rate limits: {box}"
        assert resend.snapshot()[0] == []  # fail closed: nothing sent without a token
        admin.execute_command("ACL", "SETUSER", "app", "+@scripting")
        thread.join(60)
        assert not thread.is_alive(), "the delivery never settled"
        assert box["result"].state == "SUCCESS", box["result"].traceback
        requests, _ = resend.snapshot()
        assert [r.idempotency_key for r in requests] == [f"{job['job_id']}:0"]
        assert processed(rails) == 1
        assert rails.rows("SELECT id FROM core.dead_letters") == []
        # no attempt was counted as failed for the wait
        assert [k for k in admin.scan_iter("*:deliveries:*")] == []
    finally:
        logging.getLogger().removeHandler(handler)
        admin.close()
        rails.app.close()
