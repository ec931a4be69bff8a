"""The consumer test app, traced as docs/observability.md tells users to: ``trace_workers()`` in the
app module, the exporter configured by the standard ``OTEL_*`` variables.

``tests.otel.flaky`` records, on every run, the custom header ``x-order-source`` and the
trace headers it was delivered with (``test:otel:seen:<job_id>``), fails its first
``fail_times`` runs with an ordinary error (retried) and its first ``permanent_times``
with a permanent one (dead-lettered at once).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from platform_tasks import Envelope, PermanentError, PlatformTask
from platform_tasks.observability.tracing import trace_workers
from tests.apps.consumer_app import _redis, app

__all__ = ["app"]

trace_workers()

SEEN_HEADERS = ("x-order-source", "traceparent", "sentry-trace", "baggage", "headers")


class Flaky(BaseModel):
    fail_times: int = 0
    permanent_times: int = 0


@app.task(name="tests.otel.flaky", base=PlatformTask, data_model=Flaky)
def flaky(envelope: Envelope[Flaky], tx: Any) -> None:
    job = str(envelope.job_id)
    runs = int(_redis.incr(f"test:otel:runs:{job}"))
    request = flaky.request
    seen = {name: getattr(request, name, None) for name in SEEN_HEADERS}
    _redis.rpush(f"test:otel:seen:{job}", json.dumps(seen))
    if runs <= envelope.data.permanent_times:
        raise PermanentError(f"permanent failure {runs}")
    if runs <= envelope.data.fail_times:
        raise RuntimeError(f"failure {runs} of {envelope.data.fail_times}")
