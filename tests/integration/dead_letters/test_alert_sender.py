"""The alert sender against PostgreSQL and a Better-Stack-like server on loopback.

The sender runs pass by pass in the test process (``run_pass``), so each step is driven
explicitly; the dead letters are written as the consumer writes them
(:func:`insert_dead_letter`, committed). The e2e tests run the same sender inside a
real worker.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg2.extensions import connection as Connection

from platform_tasks.dead_letters.alert_sender import AlertSender
from platform_tasks.dead_letters.dead_letter import insert_dead_letter
from platform_tasks.dead_letters.store import discard_dead_letters
from platform_tasks.envelope import uuid7
from platform_tasks.operations.bulk import bulk_discard, bulk_replay
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.betterstack_server import TOKEN, BetterStackServer

QUEUE = "billing"
KIND = "tests.alerts.charge"


@pytest.fixture
def server() -> Iterator[BetterStackServer]:
    with BetterStackServer() as srv:
        yield srv


def make_settings(
    redis_url: str, database_url: str, server: BetterStackServer, **overrides: Any
) -> PlatformSettings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "database_url": database_url,
        "profile": "test",
        "betterstack_api_url": server.url,
        "betterstack_api_token": TOKEN,
        "betterstack_requester_email": "oncall@example.com",
        "alert_send_interval_seconds": 0.05,
        "alert_retry_seconds": 0.05,
        "alert_timeout_seconds": 2.0,
    }
    values.update(overrides)
    return PlatformSettings.build(**values)


@pytest.fixture
def sender(redis_url: str, database_url: str, server: BetterStackServer) -> Iterator[AlertSender]:
    alert_sender = AlertSender(make_settings(redis_url, database_url, server))
    yield alert_sender
    alert_sender.close()


def dead_letters(
    conn: Connection,
    count: int,
    *,
    error_type: str = "RuntimeError",
    queue: str = QUEUE,
    kind: str = KIND,
    tenants: int = 3,
) -> list[int]:
    """Write ``count`` committed dead letters of one group, as the consumer does."""
    ids = []
    with conn, conn.cursor() as cur:
        for n in range(count):
            job_id = uuid7()
            tenant = f"tenant-{n % tenants}"
            correlation = uuid.uuid4().hex
            payload: dict[str, Any] = {
                "job_id": str(job_id),
                "tenant_id": tenant,
                "correlation_id": correlation,
                "kind": kind,
                "data": {"n": n},
            }
            ids.append(
                insert_dead_letter(
                    cur,
                    job_id=job_id,
                    queue=queue,
                    kind=kind,
                    tenant_id=tenant,
                    payload=payload,
                    attempts=3,
                    last_error=f"{error_type}: boom",
                    error_type=error_type,
                    reason="retries_exhausted",
                    correlation_id=correlation,
                )
            )
    return ids


def pending(conn: Connection) -> int:
    with conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM core.dead_letters WHERE status = 'pending_review'")
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def test_a_storm_of_one_group_is_one_incident_and_a_second_group_a_second(
    conn: Connection, sender: AlertSender, server: BetterStackServer
) -> None:
    dead_letters(conn, 120)
    sender.run_pass()
    dead_letters(conn, 80)  # the storm goes on while the incident is open
    for _ in range(3):
        sender.run_pass()

    (incident,) = server.all_incidents()
    assert server.count("POST", "/api/v2/incidents", 201) == 1
    assert incident.resolved_at is None
    assert KIND in incident.summary and QUEUE in incident.summary
    assert "RuntimeError" in incident.summary
    assert incident.requester_email == "oncall@example.com"
    description = incident.description or ""
    assert "Dead letters pending review: 120" in description, description
    assert "Tenants affected: 3 (tenant-0, tenant-1, tenant-2)" in description
    assert "First seen: " in description and "Last seen: " in description
    assert "platform-tasks dead-letters show " in description
    assert (
        f"platform-tasks dead-letters replay --queue {QUEUE} --kind {KIND} "
        "--error-type RuntimeError --dry-run" in description
    )
    with conn, conn.cursor() as cur:
        cur.execute("SELECT dead_letters, state, incident_id, to_send FROM core.alert_incidents")
        assert cur.fetchall() == [(200, "open", incident.id, None)]

    dead_letters(conn, 5, error_type="TimeoutError")
    sender.run_pass()
    incidents = server.all_incidents()
    assert len(incidents) == 2
    assert "TimeoutError" in incidents[1].summary
    assert server.count("POST", "/api/v2/incidents") == 2


def test_discarding_every_row_resolves_the_incident_with_a_note(
    redis_url: str,
    database_url: str,
    conn: Connection,
    sender: AlertSender,
    server: BetterStackServer,
) -> None:
    first = dead_letters(conn, 30)
    other = dead_letters(conn, 2, error_type="KeyError")
    sender.run_pass()
    assert len(server.open_incidents()) == 2

    settings = make_settings(redis_url, database_url, server)
    discard_dead_letters(conn, first[:10], reason="CLI discard")
    sender.run_pass()
    assert len(server.open_incidents()) == 2, "rows still pending: the incident stays open"

    bulk_discard(
        settings,
        OperationFilter(queue=QUEUE, error_type="RuntimeError"),
        reason="known bad batch",
        actor="alice",
    )
    sender.run_pass()
    (still_open,) = server.open_incidents()
    assert "KeyError" in still_open.summary
    resolved = next(i for i in server.all_incidents() if i.resolved_at)
    note = resolved.resolved_by or ""
    assert "30 discarded" in note and "known bad batch" in note, note
    assert "bulk discard operation" in note and "alice" in note, note
    assert pending(conn) == len(other)

    # the group fails again: a new incident, not the resolved one reopened
    dead_letters(conn, 1)
    sender.run_pass()
    assert len(server.open_incidents()) == 2
    assert len(server.all_incidents()) == 3


def test_replayed_rows_resolve_their_incident(
    redis_url: str,
    database_url: str,
    conn: Connection,
    sender: AlertSender,
    server: BetterStackServer,
) -> None:
    dead_letters(conn, 25)
    sender.run_pass()
    (incident,) = server.open_incidents()
    published: list[tuple[str, Any]] = []

    def publish(queue: str, envelope: Any, *options: Any) -> str:
        published.append((queue, envelope))
        return str(envelope["job_id"])

    bulk_replay(
        make_settings(redis_url, database_url, server),
        OperationFilter(kind=KIND),
        actor="bob",
        publish=publish,
    )
    assert len(published) == 25
    sender.run_pass()
    assert server.open_incidents() == []
    assert "25 replayed" in (incident.resolved_by or "")
    assert "bulk replay operation" in (incident.resolved_by or "")


def test_a_failing_server_loses_nothing_and_opens_the_incident_once_it_answers(
    conn: Connection, sender: AlertSender, server: BetterStackServer
) -> None:
    server.fail_with(500)
    dead_letters(conn, 50)
    wait_until(
        lambda: sender.run_pass() >= 0 and server.count("POST", "/api/v2/incidents") >= 3,
        timeout=20,
        message="three failed attempts to open the incident",
    )
    with conn, conn.cursor() as cur:
        cur.execute("SELECT to_send, incident_id, last_error, attempts FROM core.alert_incidents")
        ((to_send, incident_id, last_error, attempts),) = cur.fetchall()
    assert (to_send, incident_id) == ("open", None)
    assert "500" in last_error and attempts >= 3
    assert server.all_incidents() == []

    server.heal()
    wait_until(
        lambda: sender.run_pass() >= 0 and len(server.all_incidents()) == 1,
        timeout=20,
        message="the incident opened once the server answers",
    )
    for _ in range(3):
        sender.run_pass()
    assert len(server.all_incidents()) == 1
    assert pending(conn) == 50


def test_a_refused_token_is_retried_and_never_logged(
    redis_url: str,
    database_url: str,
    conn: Connection,
    server: BetterStackServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = "bs_wrong_token_83c1d0aa"
    sender = AlertSender(
        make_settings(redis_url, database_url, server, betterstack_api_token=wrong)
    )
    try:
        dead_letters(conn, 3)
        with caplog.at_level(logging.INFO):
            sender.check_sink()
            sender.run_pass()
        assert server.count("POST", "/api/v2/incidents", 401) == 1
        refused = [r for r in caplog.records if getattr(r, "event", None) == "alert.sink_failed"]
        assert refused and refused[0].levelno == logging.ERROR
        assert "PLATFORM_BETTERSTACK_API_TOKEN" in refused[0].getMessage()
        warned = [
            r for r in caplog.records if getattr(r, "event", None) == "alert.sink_unreachable"
        ]
        assert warned and "PLATFORM_BETTERSTACK_API_TOKEN" in warned[0].getMessage()
        assert wrong not in caplog.text and TOKEN not in caplog.text
        with conn, conn.cursor() as cur:
            cur.execute("SELECT last_error FROM core.alert_incidents")
            (last_error,) = cur.fetchone() or ("",)
        assert "401" in last_error and wrong not in last_error
    finally:
        sender.close()
    # the token fixed: the same group's incident is opened from the table
    fixed = AlertSender(make_settings(redis_url, database_url, server))
    try:
        wait_until(
            lambda: fixed.run_pass() >= 0 and len(server.all_incidents()) == 1,
            timeout=20,
            message="the incident opened with the right token",
        )
    finally:
        fixed.close()


def test_an_unreachable_url_at_start_up_is_a_warning_naming_the_setting(
    redis_url: str, database_url: str, server: BetterStackServer, caplog: pytest.LogCaptureFixture
) -> None:
    with socket_closed_port() as port:
        sender = AlertSender(
            make_settings(
                redis_url, database_url, server, betterstack_api_url=f"http://127.0.0.1:{port}"
            )
        )
        try:
            with caplog.at_level(logging.WARNING):
                sender.check_sink()
        finally:
            sender.close()
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "alert.sink_unreachable"]
    assert "PLATFORM_BETTERSTACK_API_URL" in record.getMessage()
    assert "unreachable" in record.getMessage()
    assert TOKEN not in caplog.text


class socket_closed_port:
    """A loopback port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        sock.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_hanging_server_costs_one_bounded_call_and_blocks_no_dead_letter_write(
    redis_url: str, database_url: str, conn: Connection, server: BetterStackServer
) -> None:
    sender = AlertSender(make_settings(redis_url, database_url, server, alert_timeout_seconds=0.5))
    try:
        server.hang()
        dead_letters(conn, 5)
        done = threading.Event()
        passes: list[int] = []

        def one_pass() -> None:
            passes.append(sender.run_pass())
            done.set()

        thread = threading.Thread(target=one_pass)
        started = time.monotonic()
        thread.start()
        wait_until(lambda: server.hung >= 1, timeout=10, message="the call reached the server")
        # while the call hangs, dead letters are written and committed as usual
        written = dead_letters(conn, 20)
        assert len(written) == 20 and pending(conn) == 25
        assert done.wait(10), "the call was not bounded by PLATFORM_ALERT_TIMEOUT_SECONDS"
        elapsed = time.monotonic() - started
        thread.join()
        assert passes == [1]
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_send, last_error FROM core.alert_incidents")
            ((to_send, last_error),) = cur.fetchall()
        assert to_send == "open" and "Timeout" in last_error, last_error
        assert elapsed < 10
        server.heal()
        wait_until(
            lambda: sender.run_pass() >= 0 and len(server.all_incidents()) == 1,
            timeout=20,
            message="the incident opened once the server answers",
        )
    finally:
        sender.close()


def test_an_answer_that_never_completes_is_cut_at_twice_the_timeout(
    redis_url: str, database_url: str, conn: Connection, server: BetterStackServer
) -> None:
    """httpx bounds each read, not their sum: a trickling answer must still end the call."""
    sender = AlertSender(make_settings(redis_url, database_url, server, alert_timeout_seconds=0.5))
    try:
        server.trickle()
        dead_letters(conn, 3)
        started = time.monotonic()
        assert sender.run_pass() == 1
        elapsed = time.monotonic() - started
        with conn, conn.cursor() as cur:
            cur.execute("SELECT to_send, last_error FROM core.alert_incidents")
            ((to_send, last_error),) = cur.fetchall()
        assert to_send == "open" and "not complete after 1.0s" in last_error, last_error
        assert elapsed < 10, f"the call took {elapsed:.1f}s"
        server.heal()
        wait_until(
            lambda: sender.run_pass() >= 0 and len(server.all_incidents()) == 1,
            timeout=20,
            message="the incident opened once the server answers",
        )
    finally:
        sender.close()


def test_two_senders_open_one_incident(
    redis_url: str, database_url: str, conn: Connection, server: BetterStackServer
) -> None:
    senders = [AlertSender(make_settings(redis_url, database_url, server)) for _ in range(2)]
    try:
        dead_letters(conn, 40)
        errors: list[BaseException] = []

        def run(s: AlertSender) -> None:
            try:
                for _ in range(5):
                    s.run_pass()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in senders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert len(server.all_incidents()) == 1
        with conn, conn.cursor() as cur:
            cur.execute("SELECT dead_letters FROM core.alert_incidents")
            assert cur.fetchall() == [(40,)]
    finally:
        for s in senders:
            s.close()


def test_without_a_sink_the_outbox_is_emptied_and_nothing_is_sent(
    redis_url: str, database_url: str, conn: Connection
) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, database_url=database_url)
    sender = AlertSender(settings)
    try:
        dead_letters(conn, 7)
        sender.run_pass()
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM core.alert_outbox")
            assert cur.fetchone() == (0,)
            cur.execute("SELECT count(*) FROM core.alert_incidents")
            assert cur.fetchone() == (0,)
    finally:
        sender.close()
