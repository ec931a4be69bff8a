"""One trace from the publishing request through a real prefork worker's attempts.

The test process is the web app: an in-process OpenTelemetry SDK with an in-memory
exporter and ``opentelemetry-instrumentation-celery``, publishing inside a request span.
The worker is ``celery -A tests.apps.otel_app worker`` traced as docs/observability.md says
(``trace_workers()`` in the app module, ``OTEL_*`` variables) and exports over OTLP/HTTP
to a real collector on loopback. The job's run spans must land in the publishing
request's trace on the first delivery, on the retry, and after a replay from the CLI;
the custom and Sentry headers given at publish must reach every attempt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.otlp_collector import OtlpCollector, ReceivedSpan, otlp_collector
from tests.support.processes import (
    CeleryProcess,
    celery_processes,
    platform_env,
    start_worker,
    worker_argv,
)

APP = "tests.apps.otel_app"
TASK = "tests.otel.flaky"
QUEUE = "consumer"
CLI = str(Path(sys.executable).parent / "platform-tasks")
SENTRY_TRACE = "771a43a4192642f0b136d5159a501700-b1c3a6f5e0d24c55-1"
BAGGAGE = "sentry-trace_id=771a43a4192642f0b136d5159a501700,sentry-environment=test"
ERROR = 2  # the OTLP status code of a span that failed


@pytest.fixture
def publishing_spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def _worker(
    started: list[CeleryProcess],
    collector: OtlpCollector,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
    pool: str = "prefork",
) -> CeleryProcess:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "OTEL_SERVICE_NAME": "orders-worker",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    if pool == "prefork":
        return start_worker(started, APP, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
    worker = CeleryProcess(
        worker_argv(APP, concurrency=1, pool=pool),
        env=env,
        cwd=REPO_ROOT,
        log_path=tmp_path / "worker.log",
    )
    started.append(worker.start())
    worker.wait_for_log("ready.", timeout=60)
    return worker


def _publish(
    provider: TracerProvider, redis_url: str, database_url: str, data: dict[str, Any]
) -> tuple[uuid.UUID, str, ReadableSpan]:
    """Publish inside a request span; the job id, correlation id and request span."""
    port = QueuePort(
        create_app(
            "otel_web",
            settings=PlatformSettings.build(
                redis_url=redis_url, database_url=database_url, profile="test"
            ),
        )
    )
    correlation_id = uuid.uuid4().hex
    try:
        with provider.get_tracer("web").start_as_current_span("POST /orders") as request:
            job_id = port.publish(
                QUEUE,
                {"tenant_id": "acme", "kind": TASK, "correlation_id": correlation_id, "data": data},
                {
                    "headers": {
                        "x-order-source": "web",
                        "sentry-trace": SENTRY_TRACE,
                        "baggage": BAGGAGE,
                    }
                },
            )
    finally:
        port.close()
    assert isinstance(request, ReadableSpan)
    return job_id, correlation_id, request


def _trace_hex(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}"


def _span_hex(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


def _runs(collector: OtlpCollector, trace_id: str) -> list[ReceivedSpan]:
    return [
        span
        for span in collector.spans()
        if span.trace_id == trace_id and span.name == f"run/{TASK}"
    ]


def _wait_runs(
    collector: OtlpCollector, trace_id: str, count: int, worker: CeleryProcess
) -> list[ReceivedSpan]:
    try:
        wait_until(
            lambda: len(_runs(collector, trace_id)) >= count,
            timeout=60,
            message=f"{count} run spans in trace {trace_id}",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {collector.spans()}\n{worker.log()[-4000:]}") from exc
    runs = _runs(collector, trace_id)
    return sorted(runs, key=lambda span: int(span.attributes.get("platform.attempt", 0)))


def _seen(redis_url: str, job_id: uuid.UUID) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(raw) for raw in client.lrange(f"test:otel:seen:{job_id}", 0, -1)]
    finally:
        client.close()


def _publish_span(exporter: InMemorySpanExporter, request: ReadableSpan) -> ReadableSpan:
    publishes = [
        span for span in exporter.get_finished_spans() if span.name == f"apply_async/{TASK}"
    ]
    assert len(publishes) == 1, exporter.get_finished_spans()
    publish = publishes[0]
    assert publish.parent is not None and publish.parent.span_id == request.context.span_id
    return publish


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_retried_job_is_one_trace_from_the_publishing_request(
    publishing_spans: tuple[TracerProvider, InMemorySpanExporter],
    redis_url: str,
    database_url: str,
    tmp_path: Path,
    pool: str,
) -> None:
    provider, exporter = publishing_spans
    with otlp_collector() as collector, celery_processes() as started:
        worker = _worker(started, collector, redis_url, database_url, tmp_path, pool)
        job_id, correlation_id, request = _publish(
            provider, redis_url, database_url, {"fail_times": 1}
        )
        publish = _publish_span(exporter, request)
        trace_id = _trace_hex(request)
        first, second = _wait_runs(collector, trace_id, 2, worker)
        spans = {span.span_id: span for span in collector.spans()}

    # attempt 1: a child of the publish, failed
    assert first.parent_span_id == _span_hex(publish)
    assert first.attributes["platform.attempt"] == 1
    assert first.status_code == ERROR
    assert first.service_name == "orders-worker"
    # attempt 2: same trace, under the retry's publish, which is under attempt 1; succeeded
    assert second.attributes["platform.attempt"] == 2
    assert second.status_code != ERROR
    retry_publish = spans[second.parent_span_id]
    assert retry_publish.name == f"apply_async/{TASK}"
    assert retry_publish.parent_span_id == first.span_id
    for run in (first, second):
        assert run.attributes["correlation_id"] == correlation_id
        assert run.attributes["messaging.message.id"] == str(job_id)
    # the custom and Sentry headers given at publish reached both attempts
    seen = _seen(redis_url, job_id)
    assert [s["x-order-source"] for s in seen] == ["web", "web"]
    assert [s["sentry-trace"] for s in seen] == [SENTRY_TRACE, SENTRY_TRACE]
    assert [s["baggage"] for s in seen] == [BAGGAGE, BAGGAGE]
    # and where Sentry's Celery integration reads them on the worker
    assert [s["headers"]["sentry-trace"] for s in seen] == [SENTRY_TRACE, SENTRY_TRACE]
    assert all(trace_id in s["traceparent"] for s in seen)


def test_a_replayed_dead_letter_continues_the_publishing_trace(
    publishing_spans: tuple[TracerProvider, InMemorySpanExporter],
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    provider, exporter = publishing_spans
    with otlp_collector() as collector, celery_processes() as started:
        worker = _worker(started, collector, redis_url, database_url, tmp_path)
        job_id, correlation_id, request = _publish(
            provider, redis_url, database_url, {"permanent_times": 1}
        )
        publish = _publish_span(exporter, request)
        trace_id = _trace_hex(request)
        (dead,) = _wait_runs(collector, trace_id, 1, worker)

        def dead_letter() -> list[tuple[Any, ...]]:
            return query(
                database_url,
                "SELECT id, headers FROM core.dead_letters WHERE job_id = %s",
                str(job_id),
            )

        wait_until(lambda: bool(dead_letter()), timeout=30, message="the dead letter row")
        ((row_id, headers),) = dead_letter()
        assert trace_id in headers["traceparent"]
        assert headers["x-order-source"] == "web"
        replay = subprocess.run(
            [CLI, "dead-letters", "replay", str(row_id)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=platform_env(redis_url=redis_url, database_url=database_url),
        )
        assert replay.returncode == 0, replay.stderr
        runs = _wait_runs(collector, trace_id, 2, worker)

    assert dead.parent_span_id == _span_hex(publish)
    assert dead.status_code == ERROR
    (replayed,) = [run for run in runs if run.span_id != dead.span_id]
    # the replay carried the trace context the job was dead-lettered with
    assert replayed.parent_span_id == _span_hex(publish)
    assert replayed.status_code != ERROR
    assert replayed.attributes["correlation_id"] == correlation_id
    seen = _seen(redis_url, job_id)
    assert [s["x-order-source"] for s in seen] == ["web", "web"]
    assert [s["sentry-trace"] for s in seen] == [SENTRY_TRACE, SENTRY_TRACE]
