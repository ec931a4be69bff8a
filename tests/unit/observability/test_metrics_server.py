"""A worker serves /metrics as beat does: a port in use is logged, never fatal, and the
server stops with the worker."""

from __future__ import annotations

import logging
import socket
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from platform_tasks.kernel import PlatformCelery
from platform_tasks.observability.metrics import MetricsServerStep
from platform_tasks.settings import PlatformSettings


def _worker(port: int) -> Any:
    """A worker of an app with no installers, so no collector reads a server at scrape."""
    app = PlatformCelery("metrics_server", set_as_current=False)
    app.platform_settings = PlatformSettings.build(profile="test", metrics_port=port)
    return SimpleNamespace(app=app)


def test_a_worker_whose_metrics_port_is_taken_logs_it_and_runs_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        worker = _worker(taken.getsockname()[1])
        step = MetricsServerStep(worker)
        with caplog.at_level(logging.WARNING):
            step.start(worker)
    assert step.server is None
    assert [getattr(r, "role", None) for r in caplog.records if r.levelno == logging.WARNING] == [
        "worker"
    ]
    assert "metrics.port_unavailable" in [getattr(r, "event", None) for r in caplog.records]


def test_a_worker_serves_metrics_until_it_stops() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = _worker(port)
    step = MetricsServerStep(worker)
    step.start(worker)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"platform_jobs_processed_total" in response.read()
    finally:
        step.stop(worker)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
