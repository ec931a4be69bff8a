"""Without OpenTelemetry installed (the ``otel`` extra left out) the platform publishes and
consumes as before, headers still travel, and ``trace_workers()`` names the extra.

Run in a fresh interpreter where ``import opentelemetry`` fails, as it does when the
package is absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["opentelemetry"] = None  # what an absent package gives: ImportError
    from platform_tasks import create_app
    from platform_tasks.errors import ConfigurationError
    from platform_tasks.observability.trace_context import outgoing_headers, running_with
    from platform_tasks.consumer.span_hooks import span_hooks
    from platform_tasks.observability.tracing import trace_workers
    from platform_tasks.settings import PlatformSettings

    create_app("no_otel", settings=PlatformSettings.build(redis_url="redis://127.0.0.1:1/0"))
    assert span_hooks() == []
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with running_with({"traceparent": tp}):
        assert outgoing_headers({"x": "1"}, published_at=1.0)["traceparent"] == tp
    try:
        trace_workers()
    except ConfigurationError as exc:
        print("refused:", exc)
""")


def test_the_platform_works_without_opentelemetry() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout
    assert "pip install 'platform-tasks[otel]'" in result.stdout
