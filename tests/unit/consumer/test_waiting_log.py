"""How a delivery that waits says why: an outage is logged as one, a failed step (a
programming error) as the failure it is, never as "database or Redis unavailable"."""

from __future__ import annotations

import logging

import pytest

from platform_tasks.consumer.servers import Backoff


def test_an_outage_and_a_failed_step_are_logged_apart(caplog: pytest.LogCaptureFixture) -> None:
    slept: list[float] = []
    backoff = Backoff(slept.append)
    with caplog.at_level(logging.WARNING, logger="platform_tasks.consumer.servers"):
        backoff.wait("OperationalError: server closed the connection")
        backoff.wait("ValueError: year 10282 is out of range", outage=False)
    outage, failure = caplog.records
    assert getattr(outage, "event", None) == "consumer.waiting_for_servers"
    assert "unavailable" in outage.getMessage()
    assert getattr(failure, "event", None) == "consumer.waiting_after_error"
    assert failure.levelno == logging.ERROR
    assert "unavailable" not in failure.getMessage()
    assert "ValueError" in failure.getMessage()
    assert slept == [0.25, 0.5]  # both still back off before the next try
