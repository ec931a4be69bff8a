"""The Resend adapter against a Resend-like HTTP server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from platform_tasks.errors import PermanentError
from platform_tasks.notifications.message import Attachment, EmailMessage
from platform_tasks.notifications.provider import (
    ProviderBusy,
    ProviderError,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    ProviderRejected,
    ProviderUnavailable,
)
from platform_tasks.notifications.resend import ALLOWED_PATHS, ResendProvider
from platform_tasks.testing.servers import wait_until
from tests.support.resend_server import API_KEY, ResendLikeServer

FORBIDDEN = (
    "/audiences",
    "/contacts",
    "/segments",
    "/topics",
    "/broadcasts",
    "/contact-properties",
)


def email(n: int = 0, to: str | None = None, **extra: object) -> EmailMessage:
    return EmailMessage(
        "Shop <shop@example.com>",
        to or f"user{n}@example.org",
        f"Hello {n}",
        text=f"body {n}",
        **extra,
    )


def provider(server: ResendLikeServer, key: str = API_KEY) -> ResendProvider:
    return ResendProvider(SecretStr(key), server.url)


def test_single_email_goes_to_emails_with_the_idempotency_key(resend: ResendLikeServer) -> None:
    result = provider(resend).send([email()], idempotency_key="job-1", batch=False)
    requests, emails = resend.snapshot()
    assert [(r.path, r.idempotency_key, r.status) for r in requests] == [("/emails", "job-1", 200)]
    assert result.ids == [emails[0].id]
    assert emails[0].to == ["user0@example.org"]
    assert requests[0].body["from"] == "Shop <shop@example.com>"


def test_batch_goes_to_emails_batch_and_holds_at_most_100(resend: ResendLikeServer) -> None:
    adapter = provider(resend)
    result = adapter.send([email(n) for n in range(100)], idempotency_key="b-1", batch=True)
    assert len(result.ids) == 100
    with pytest.raises(ProviderRejected, match="1 to 100"):
        adapter.send([email(n) for n in range(101)], idempotency_key="b-2", batch=True)
    requests, emails = resend.snapshot()
    assert [r.path for r in requests] == ["/emails/batch"]  # the 101 never left
    assert len(emails) == 100


@pytest.mark.parametrize(
    "extra",
    [
        {"attachments": [Attachment(filename="a.pdf", content="QUJD")]},
        {"scheduled_at": datetime(2030, 1, 1, tzinfo=UTC)},
    ],
)
def test_batch_refuses_what_the_endpoint_would_drop(
    resend: ResendLikeServer, extra: dict[str, object]
) -> None:
    with pytest.raises(PermanentError):
        provider(resend).send([email(0), email(1, **extra)], idempotency_key="b", batch=True)
    assert resend.snapshot()[0] == []


def test_same_key_same_body_returns_the_same_ids_and_sends_once(resend: ResendLikeServer) -> None:
    adapter = provider(resend)
    first = adapter.send([email(1), email(2)], idempotency_key="job-7", batch=True)
    again = adapter.send([email(1), email(2)], idempotency_key="job-7", batch=True)
    assert first.ids == again.ids
    assert len(resend.snapshot()[1]) == 2
    with pytest.raises(ProviderRejected) as info:
        adapter.send([email(3)], idempotency_key="job-7", batch=True)
    assert info.value.name == "invalid_idempotent_request"
    assert isinstance(info.value, PermanentError)


def test_same_key_in_flight_is_busy(resend: ResendLikeServer) -> None:
    adapter = provider(resend)
    resend.gate.clear()  # hold the first request in flight
    thread = threading.Thread(
        target=lambda: adapter.send([email()], idempotency_key="k", batch=False)
    )
    thread.start()
    try:
        wait_until(lambda: resend.in_flight() == 1, timeout=30)
        with pytest.raises(ProviderBusy) as info:
            provider(resend).send([email()], idempotency_key="k", batch=False)
    finally:
        resend.gate.set()
        thread.join()
    assert info.value.retry_after > 0
    assert len(resend.snapshot()[1]) == 1


def test_429_rate_limit_carries_retry_after_and_headers(resend: ResendLikeServer) -> None:
    resend.fail_next(
        429,
        "rate_limit_exceeded",
        headers={
            "retry-after": "3",
            "ratelimit-limit": "2",
            "ratelimit-remaining": "0",
            "ratelimit-reset": "1",
        },
    )
    with pytest.raises(ProviderRateLimited) as info:
        provider(resend).send([email()], idempotency_key="j", batch=False)
    assert info.value.retry_after == 3
    assert info.value.limits.limit == 2


def test_quota_429_is_not_a_rate_limit(resend: ResendLikeServer) -> None:
    resend.exhaust_quota(30)
    with pytest.raises(ProviderQuotaExceeded) as info:
        provider(resend).send([email()], idempotency_key="j", batch=False)
    assert info.value.name == "daily_quota_exceeded"
    assert info.value.reset_seconds is not None and 0 < info.value.reset_seconds <= 30


def test_server_errors_and_network_errors_are_transient(resend: ResendLikeServer) -> None:
    resend.fail_next(503, "internal_server_error")
    with pytest.raises(ProviderUnavailable) as info:
        provider(resend).send([email()], idempotency_key="j", batch=False)
    assert not isinstance(info.value, PermanentError)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    closed = ResendProvider(SecretStr(API_KEY), f"http://127.0.0.1:{port}")
    with pytest.raises(ProviderUnavailable):
        closed.send([email()], idempotency_key="j", batch=False)


def test_validation_errors_are_permanent(resend: ResendLikeServer) -> None:
    resend.fail_next(422, "validation_error", message="Invalid `to` field")
    with pytest.raises(ProviderRejected) as info:
        provider(resend).send([email()], idempotency_key="j", batch=False)
    assert isinstance(info.value, PermanentError)
    assert "Invalid `to` field" in str(info.value)


def test_api_key_never_appears_in_errors_or_repr(resend: ResendLikeServer) -> None:
    secret = "re_live_do_not_print_me"
    adapter = provider(resend, key=secret)
    errors: list[ProviderError] = []
    for status, name in [
        (401, "invalid_api_key"),
        (500, "internal_server_error"),
        (422, "validation_error"),
        (429, "rate_limit_exceeded"),
    ]:
        resend.fail_next(status, name)
        with pytest.raises(ProviderError) as info:
            adapter.send([email()], idempotency_key="j", batch=False)
        errors.append(info.value)
    for error in errors:
        assert secret not in str(error) and secret not in repr(error)
        assert error.__cause__ is None or secret not in str(error.__cause__)
    assert secret not in repr(adapter)


def test_only_the_two_email_paths_are_ever_requested(resend: ResendLikeServer) -> None:
    adapter = provider(resend)
    adapter.send([email()], idempotency_key="a", batch=False)
    adapter.send([email(1), email(2)], idempotency_key="b", batch=True)
    for path in FORBIDDEN:
        with pytest.raises(RuntimeError):
            adapter._post(path, {}, "x", batch=False)
    paths = {r.path for r in resend.snapshot()[0]}
    assert paths == set(ALLOWED_PATHS)
    assert not any(p.startswith(FORBIDDEN) for p in paths)


def test_the_server_counts_a_request_when_its_request_line_arrives() -> None:
    """The Resend-like server's rate limit counts arrival, not the moment its thread has
    read the whole body: a request whose body comes later is stamped when it began."""
    with ResendLikeServer(rate_limit=50) as server:
        port = int(server.url.rsplit(":", 1)[1])
        body = b'{"from": "a@example.com", "to": "b@example.org", "subject": "s", "text": "t"}'
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(
                b"POST /emails HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            )
            # the client stalls mid-request until the server has the request line
            wait_until(lambda: server.request_lines == 1, timeout=10)
            body_sent = time.monotonic()
            conn.sendall(body)
            answer = conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        (request,) = server.snapshot()[0]
        assert request.at < body_sent  # stamped with its request line, not its body


def test_batch_is_validated_per_email_and_reports_the_refused_ones(
    resend: ResendLikeServer,
) -> None:
    emails = [email(0), email(1, to="bad..dots@example.org"), email(2)]
    result = provider(resend).send(emails, idempotency_key="b-3", batch=True)
    (request,), sent = resend.snapshot()
    assert request.status == 200
    assert [e.to for e in sent] == [["user0@example.org"], ["user2@example.org"]]
    assert result.ids == [e.id for e in sent]
    assert [r.index for r in result.rejected] == [1]
    assert "Invalid `to` field" in result.rejected[0].message
