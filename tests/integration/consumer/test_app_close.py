"""``app.close()`` lets go of the connections the app's consumer opened in this process."""

from __future__ import annotations

from urllib.parse import urlsplit

from platform_tasks.envelope import uuid7
from tests.integration.consumer.conftest import Harness
from tests.support.connections import established_to


def test_closing_the_app_closes_its_consumers_database_connections(harness: Harness) -> None:
    """An app made at run time (a test's) and closed leaves no PostgreSQL session behind.

    Without it, every app a test suite makes and closes kept its consumer's session open
    until the process exited, one more towards the server's ``max_connections`` each.
    """
    port = urlsplit(harness.database_url).port
    assert port is not None
    before = established_to(port)
    payload = {
        "job_id": str(uuid7()),
        "tenant_id": "tenant-1",
        "correlation_id": "corr-1",
        "kind": "tests.it.apply",
        "data": {"key": "close"},
    }
    assert harness.apply(payload).state == "SUCCESS"
    opened = established_to(port) - before
    # the consumer's own sessions among them (its connections name themselves)
    consumer_ports = {
        row[0]
        for row in harness.rows(
            "SELECT client_port FROM pg_stat_activity "
            "WHERE application_name = 'platform-tasks-consumer' AND client_port = ANY(%s)",
            sorted(opened),
        )
    }
    assert consumer_ports, "the job ran without a consumer session of this process"
    harness.app.close()
    assert consumer_ports & established_to(port) == set()
