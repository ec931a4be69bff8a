"""``app.close()`` lets go of the connections the app's consumer opened in this process."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import psutil

from platform_tasks.envelope import uuid7
from tests.integration.consumer.conftest import Harness


def open_connections(port: int) -> set[tuple[str, int]]:
    """Local ends of this process's established connections to ``port``."""
    return {
        (conn.laddr.ip, conn.laddr.port)
        for conn in psutil.net_connections(kind="tcp")
        if conn.pid == os.getpid() and conn.raddr and conn.raddr.port == port
        and conn.status == psutil.CONN_ESTABLISHED
    }  # fmt: skip


def test_closing_the_app_closes_its_consumers_database_connections(harness: Harness) -> None:
    """An app made at run time (a test's) and closed leaves no PostgreSQL session behind.

    Without it, every app a test suite makes and closes kept its consumer's session open
    until the process exited, one more towards the server's ``max_connections`` each.
    """
    port = urlsplit(harness.database_url).port
    assert port is not None
    before = open_connections(port)
    payload = {"job_id": str(uuid7()), "tenant_id": "tenant-1", "correlation_id": "corr-1",
               "kind": "tests.it.apply", "data": {"key": "close"}}  # fmt: skip
    assert harness.apply(payload).state == "SUCCESS"
    opened = open_connections(port) - before
    # the consumer's own sessions among them (its connections name themselves)
    consumer_ports = {
        row[0]
        for row in harness.rows(
            "SELECT client_port FROM pg_stat_activity "
            "WHERE application_name = 'platform-tasks-consumer' AND client_port = ANY(%s)",
            sorted(local_port for _, local_port in opened),
        )
    }
    assert consumer_ports, "the job ran without a consumer session of this process"
    harness.app.close()
    still_open = {local_port for _, local_port in open_connections(port)}
    assert consumer_ports & still_open == set()
