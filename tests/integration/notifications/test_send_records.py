"""A job's send record: what it sent is not sent again, nor sent differently.

A request the provider accepted but whose answer was lost is not sent again blind.

The real consumer pipeline in process, real Redis and PostgreSQL, the real Resend adapter
with a short timeout against the Resend-like server, which sends the email and then holds
its answer past that timeout. "A day later" is the provider forgetting its keys
(``forget_keys``) and the job's send record saying its request was first tried 24 h ago
(the record is stamped with Redis time; the test moves that stamp, as a clock would).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import BaseModel, SecretStr

from platform_tasks.keys import send_record_keys
from platform_tasks.notifications import EmailMessage, NotificationTask, register_provider
from platform_tasks.notifications.provider import ProviderRateLimited, SendResult
from platform_tasks.notifications.resend import ResendProvider
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.integration.notifications.test_notification_task import Rails, make_rails, payload
from tests.support.resend_server import API_KEY, ResendLikeServer

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def rails(settings: PlatformSettings, resend: ResendLikeServer) -> Iterator[Rails]:
    r = make_rails(settings, resend)
    yield r
    r.app.close()


@pytest.fixture
def impatient(settings: PlatformSettings, resend: ResendLikeServer) -> Iterator[Rails]:
    """Rails whose Resend client gives up after 0.3 s."""
    rails = make_rails(settings, resend)
    register_provider(
        rails.app,
        "resend",
        lambda s: ResendProvider(SecretStr(API_KEY), resend.url, timeout=0.3),
    )
    yield rails
    rails.app.close()


def _answer_lost(rails: Rails, resend: ResendLikeServer, job: dict[str, object]) -> None:
    """Apply ``job`` once while the server holds its answer past the client's timeout."""
    resend.answer_delay = 2.0
    assert rails.apply(rails.receipt, job).state == "RETRY"  # a timeout: an ordinary retry
    assert len(resend.snapshot()[1]) == 1  # ...but the provider had sent the email
    wait_until(lambda: resend.in_flight() == 0, timeout=30, message="the held answer")
    resend.answer_delay = 0.0


def test_accepted_request_whose_answer_was_lost_is_not_sent_again_after_a_day(
    impatient: Rails, resend: ResendLikeServer, redis_client: redis.Redis
) -> None:
    job = payload("shop.receipt", {"email": "ada@example.org"})
    _answer_lost(impatient, resend, job)
    resend.forget_keys()
    seconds, micros = redis_client.time()
    record = send_record_keys("test").job(str(job["job_id"]))
    redis_client.hset(record, "t0", int(seconds) * 1000 + int(micros) // 1000 - DAY_MS)

    result = impatient.apply(impatient.receipt, job, attempt=2)

    _, emails = resend.snapshot()
    assert [e.to for e in emails] == [["ada@example.org"]], "the email was sent twice"
    assert result.state == "FAILURE"
    ((reason, error),) = impatient.rows("SELECT reason, last_error FROM core.dead_letters")
    assert reason == "permanent_error"
    assert "request 0 of this job was tried 24.0 h ago and never answered" in error
    assert not redis_client.hexists(record, "t0")  # a replay sends it


def test_accepted_request_whose_answer_was_lost_is_answered_by_its_key_within_a_day(
    impatient: Rails, resend: ResendLikeServer
) -> None:
    job = payload("shop.receipt", {"email": "ada@example.org"})
    _answer_lost(impatient, resend, job)
    assert impatient.apply(impatient.receipt, job, attempt=2).state == "SUCCESS"
    requests, emails = resend.snapshot()
    assert [e.to for e in emails] == [["ada@example.org"]]
    assert [r.replayed for r in requests] == [False, True]
    assert impatient.rows("SELECT count(*) FROM core.dead_letters") == [(0,)]


class Count(BaseModel):
    count: int


def test_resumed_job_sends_what_it_rendered_first_not_its_new_render(
    rails: Rails, resend: ResendLikeServer
) -> None:
    """The render numbers its runs in the subject; request 1 is refused with a 429 on the
    first run. The second run renders other subjects but sends the first rendering."""
    runs: list[int] = []

    @rails.app.task(base=NotificationTask, data_model=Count, name="shop.statement", shared=False)
    def statement(envelope: Any, tx: Any) -> list[EmailMessage]:
        runs.append(len(runs) + 1)
        return [
            EmailMessage("shop@example.com", f"s{i}@example.org", f"run {runs[-1]}", text="x")
            for i in range(envelope.data.count)
        ]

    job = payload("shop.statement", {"count": 150})
    resend.fail_next(
        429, "rate_limit_exceeded", headers={"retry-after": "0"}, key=f"{job['job_id']}:1"
    )
    assert rails.apply(statement, job).state == "RETRY"  # throttled at request 1
    assert rails.apply(statement, job).state == "SUCCESS"
    assert runs == [1, 2]
    requests, emails = resend.snapshot()
    assert [(r.idempotency_key, r.status) for r in requests] == [
        (f"{job['job_id']}:0", 200),
        (f"{job['job_id']}:1", 429),
        (f"{job['job_id']}:1", 200),
    ]
    assert sorted(e.to[0] for e in emails) == sorted(f"s{i}@example.org" for i in range(150))
    assert {e.subject for e in emails} == {"run 1"}


class OneAtATime:
    """An SMS-like adapter: one message a request, no idempotency keys of its own; the
    first try of a job's second request is answered 429."""

    name = "sms"
    max_batch = 1

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def send(self, messages: Any, *, idempotency_key: str, batch: bool) -> SendResult:
        (message,) = messages
        refused = idempotency_key.endswith(":1") and not any(
            key == idempotency_key for key, _ in self.calls
        )
        self.calls.append((idempotency_key, message["to"]))
        if refused:
            raise ProviderRateLimited("slow down", provider=self.name, retry_after=0)
        return SendResult(ids=[f"sms-{len(self.calls)}"])

    def close(self) -> None:
        pass


def test_one_message_per_request_adapter_resumes_at_its_second_message(
    settings: PlatformSettings, resend: ResendLikeServer
) -> None:
    adapter = OneAtATime()
    rails = make_rails(settings, resend, provider_rate_limits="resend=1000/s,sms=1000/s")
    try:
        register_provider(rails.app, "sms", lambda s: adapter)

        @rails.app.task(
            base=NotificationTask, data_model=Count, name="shop.texts", provider="sms", shared=False
        )
        def texts(envelope: Any, tx: Any) -> list[dict[str, str]]:
            return [{"to": f"+4470000000{i}"} for i in range(envelope.data.count)]

        job = payload("shop.texts", {"count": 2})
        assert rails.apply(texts, job).state == "RETRY"  # the 429 on message 1
        assert rails.apply(texts, job).state == "SUCCESS"
        key = str(job["job_id"])
        assert adapter.calls == [
            (f"{key}:0", "+44700000000"),
            (f"{key}:1", "+44700000001"),
            (f"{key}:1", "+44700000001"),
        ]
    finally:
        rails.app.close()
