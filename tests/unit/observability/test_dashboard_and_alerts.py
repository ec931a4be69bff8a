"""The workers dashboard and the alert rules query only series a worker exports, and the
dashboard shows every celery-exporter series and queue gauge the platform adds."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client import REGISTRY

from platform_tasks.consumer import exporter_metrics as celery_exporter_metrics
from platform_tasks.observability import (  # noqa: F401 (registers the families)
    metrics,
    outbox_metrics,
    scheduler_metrics,
)
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "docs" / "grafana-workers.json"
ALERTS = REPO_ROOT / "docs" / "prometheus-alerts.yml"
QUEUE_GAUGES = (
    "celery_queue_length",
    "platform_queue_runnable",
    "platform_queue_latency_seconds",
    "platform_dead_letters_pending",
)
"""Measured by the queue collector on a scrape (not in the global registry)."""
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
_NAME = re.compile(r"\b((?:celery|platform)_[a-z_]+)")


def exported() -> set[str]:
    names = {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith(("celery_", "platform_"))
        for suffix in _SUFFIXES.get(family.type, ("",))
    }
    return names | set(QUEUE_GAUGES)


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    return [rule["expr"] for rule in rules]


def test_dashboard_queries_exported_names_and_shows_the_worker_series() -> None:
    queried = {name for expr in dashboard_queries() for name in _NAME.findall(expr)}
    assert queried <= exported(), sorted(queried - exported())
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in queried}
    wanted = {re.sub(r"_total$", "", n) for n in celery_exporter_metrics.METRIC_NAMES}
    wanted |= {
        "platform_queue_latency_seconds",
        "platform_dead_letters_pending",
        "platform_delay_promotion_lag_seconds",
        "platform_outbox_rows_waiting",
        "platform_outbox_lag_seconds",
        "platform_queue_runnable",
    }
    assert wanted <= families, sorted(wanted - families)


def test_alert_rules_cover_latency_dead_letters_and_workers() -> None:
    queries = alert_queries()
    queried = {name for expr in queries for name in _NAME.findall(expr)}
    assert queried <= exported(), sorted(queried - exported())
    assert {
        "platform_queue_latency_seconds",
        "platform_dead_letters_pending",
        "celery_worker_up",
        "platform_outbox_lag_seconds",
    } <= queried


def test_documented_names_are_in_the_observability_guide() -> None:
    guide = (REPO_ROOT / "docs" / "observability.md").read_text()
    for name in (*celery_exporter_metrics.METRIC_NAMES, *QUEUE_GAUGES):
        assert f"`{name}" in guide, f"{name} is not in docs/observability.md"
