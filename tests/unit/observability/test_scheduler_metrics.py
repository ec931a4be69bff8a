"""Beat and delay metrics: what a point outcome counts, and the example Grafana dashboard
queries only names the platform exports (and shows every one of them)."""

from __future__ import annotations

import json
import re

from prometheus_client import REGISTRY

from platform_tasks.jobs.trigger import PointOutcome, PointResult
from platform_tasks.observability import scheduler_metrics
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "docs" / "grafana-scheduler.json"
_SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}


def exported_series() -> dict[str, str]:
    """Series name -> family name, for every family the module registers."""
    ours = {
        family.name: family.type
        for family in REGISTRY.collect()
        if family.name.startswith(("platform_beat_", "platform_delay_", "platform_job_lease_"))
    }
    return {
        family + suffix: family
        for family, kind in ours.items()
        for suffix in _SERIES_SUFFIXES[kind]
    }


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_queries_only_exported_names_and_shows_every_metric() -> None:
    series = exported_series()
    queried = {
        name for expr in dashboard_queries() for name in re.findall(r"\bplatform_[a-z_]+", expr)
    }
    assert queried, "the dashboard queries nothing"
    assert queried <= set(series), f"not exported: {sorted(queried - set(series))}"
    assert {series[name] for name in queried} == set(series.values()), "a metric has no panel"


def test_the_documented_names_are_the_exported_ones() -> None:
    series = exported_series()
    documented = set(scheduler_metrics.METRIC_NAMES)
    assert {n for n in documented if n in series} == documented - {
        "platform_beat_admission_latency_seconds"
    }
    assert "platform_beat_admission_latency_seconds_bucket" in series
    guide = (REPO_ROOT / "docs" / "scheduled-jobs.md").read_text()
    for name in documented:
        assert f"`{name}`" in guide, f"{name} is not in docs/scheduled-jobs.md"


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _result(outcome: PointOutcome, judged_at_ms: int | None = None) -> PointResult:
    return PointResult("job", 10_000, outcome, 20_000, 10_000, judged_at_ms=judged_at_ms)


def test_beat_metrics_count_outcomes_per_replica() -> None:
    replica = "unit-host:1"
    metrics = scheduler_metrics.BeatMetrics(replica)
    before = {
        "admitted": _value("platform_beat_points_admitted_total", replica=replica),
        "overlap": _value("platform_beat_points_skipped_total", replica=replica, reason="overlap"),
        "latency": _value("platform_beat_admission_latency_seconds_sum", replica=replica),
    }
    for result in (
        _result(PointOutcome.ADMITTED, judged_at_ms=10_250),
        _result(PointOutcome.ADMITTED, judged_at_ms=10_750),
        _result(PointOutcome.SKIPPED_OVERLAP, judged_at_ms=10_100),
        _result(PointOutcome.NOT_YET, judged_at_ms=9_000),
    ):
        metrics.observe(result)
    assert _value("platform_beat_points_admitted_total", replica=replica) == before["admitted"] + 2
    overlap = _value("platform_beat_points_skipped_total", replica=replica, reason="overlap")
    assert overlap == before["overlap"] + 1
    latency = _value("platform_beat_admission_latency_seconds_sum", replica=replica)
    assert abs(latency - before["latency"] - 1.0) < 1e-9
    # a point that stays pending is not a skip
    assert _value("platform_beat_points_skipped_total", replica=replica, reason="not_yet") == 0


def test_a_metrics_port_in_use_is_logged_not_fatal(caplog) -> None:  # type: ignore[no-untyped-def]
    import logging
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        caplog.set_level(logging.WARNING)
        assert scheduler_metrics.serve(port, role="beat") is None
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "metrics.port_unavailable" in events
