"""The one ``/metrics`` endpoint a process serves: a worker's main process, or beat.

Workers and beat serve Prometheus metrics on ``PLATFORM_METRICS_PORT`` through this one
function, so both behave alike: a port already taken is logged (event
``metrics.port_unavailable``), never fatal, since a process that runs jobs or admits
points should not stop over its metrics; and the server can be stopped again (beat stops
it when it stops, a worker's bootstep when the worker does).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["MetricsServer", "serve"]

logger = logging.getLogger(__name__)


class MetricsServer:
    """A ``/metrics`` endpoint this process started, so it can be stopped again."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    port: int, *, role: str, registry: CollectorRegistry | None = None
) -> MetricsServer | None:
    """Serve ``registry`` (``None``: the default one) on ``port``; a port in use is logged,
    never fatal (``None`` is returned)."""
    try:
        if registry is None:
            server, thread = start_http_server(port)
        else:
            server, thread = start_http_server(port, registry=registry)
    except OSError as exc:
        logger.warning(
            "%s: cannot serve metrics on port %d (%s); running without",
            role,
            port,
            exc,
            extra={"event": "metrics.port_unavailable", "port": port, "role": role},
        )
        return None
    logger.info(
        "%s: serving metrics on port %d",
        role,
        port,
        extra={"event": "metrics.serving", "port": port, "role": role},
    )
    return MetricsServer(server, thread)
