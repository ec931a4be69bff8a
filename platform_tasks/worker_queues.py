"""Which queues a worker consumes when it is started the way users start it: without ``-Q``.

Celery's worker consumes only the queues it knows of (``task_default_queue`` and
``task_queues``). The platform itself routes work to other queues (scheduled-job
triggers, notification rails, fan-out), and a job on a queue nobody consumes never runs.
So every concern that routes to a queue of its own registers a *queue source* here, and a
worker started without ``-Q`` consumes all of them besides the default queue. With ``-Q``
(or ``-X``) the user's choice stands, and the worker logs once which platform queues it
does not consume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from celery import bootsteps

__all__ = ["QueueSource", "WorkerQueuesStep", "add_queue_source", "install", "platform_queues"]

logger = logging.getLogger(__name__)

QueueSource = Callable[[Any], Iterable[str]]
"""Called with the app when a worker starts; returns the queue names a concern routes to."""

_SOURCES_ATTRIBUTE = "platform_queue_sources"


def add_queue_source(app: Any, source: QueueSource) -> None:
    """Register ``source``: its queues are consumed by every worker started without ``-Q``."""
    sources: list[QueueSource] | None = getattr(app, _SOURCES_ATTRIBUTE, None)
    if sources is None:
        sources = []
        setattr(app, _SOURCES_ATTRIBUTE, sources)
    sources.append(source)


def platform_queues(app: Any) -> list[str]:
    """The default queue and every queue a registered source names, in a stable order."""
    names: dict[str, None] = {app.conf.task_default_queue or "default": None}
    for source in getattr(app, _SOURCES_ATTRIBUTE, None) or ():
        for name in source(app):
            if name:
                names.setdefault(name, None)
    return list(names)


class WorkerQueuesStep(bootsteps.Step):  # type: ignore[misc]
    """Before the consumer starts: add the platform's queues, or report the ones left out."""

    label = "platform worker queues"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        app = worker.app
        queues = app.amqp.queues
        # -Q or -X narrowed the selection. (Celery 5.7's ``consume_from`` is a dict of its
        # own even without -Q, so only ``_consume_from`` tells the two apart.)
        selected = getattr(queues, "_consume_from", None) is not None
        wanted = platform_queues(app)
        if not selected:
            for name in wanted:
                if name not in queues.consume_from:
                    queues.select_add(name)
            return
        consumed = set(queues.consume_from)
        missing = [name for name in wanted if name not in consumed]
        if missing:
            logger.warning(
                "this worker does not consume platform queue(s) %s (selected with -Q/-X); "
                "jobs routed there wait for another worker",
                ", ".join(missing),
                extra={"event": "worker.platform_queues_not_consumed", "queues": missing},
            )


def install(app: Any) -> None:
    """Let every worker of ``app`` consume the platform's queues unless ``-Q`` says otherwise."""
    app.steps["worker"].add(WorkerQueuesStep)
