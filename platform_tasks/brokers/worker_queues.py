"""Which queues a worker consumes when it is started the way users start it: without ``-Q``.

Celery's worker consumes only the queues it knows of (``task_default_queue`` and
``task_queues``). The platform itself routes work to other queues (scheduled-job
triggers, notification rails, fan-out), and a job on a queue nobody consumes never runs.
So every concern that routes to a queue of its own registers a *queue source* here, and a
worker started without ``-Q`` consumes all of them besides the default queue. With ``-Q``
(or ``-X``) the user's choice stands, and the worker logs once which platform queues it
does not consume. A queue the application already declared itself (in ``task_queues``, or
added as routing-only) keeps the application's declaration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from platform_tasks.app_state import AppState

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["QueueSource", "WorkerQueuesStep", "add_queue_source", "install", "platform_queues"]

logger = logging.getLogger(__name__)

QueueSource = Callable[["PlatformCelery"], Iterable[str]]
"""Called with the app when a worker starts; returns the queue names a concern routes to."""

_SOURCES: AppState[list[QueueSource]] = AppState("platform_queue_sources")


def add_queue_source(app: PlatformCelery, source: QueueSource) -> None:
    """Register ``source``: its queues are consumed by every worker started without ``-Q``."""
    _SOURCES.get_or_set(app, list).append(source)


def platform_queues(app: PlatformCelery) -> list[str]:
    """The default queue and every queue a registered source names, in a stable order."""
    names: dict[str, None] = {app.conf.task_default_queue or "default": None}
    for source in _SOURCES.get(app) or ():
        for name in source(app):
            if name:
                names.setdefault(name, None)
    return list(names)


def _narrowed_by_q(queues: Any) -> bool:
    """True when ``-Q`` selected the queues to consume.

    Celery keeps that selection in ``Queues._consume_from`` (``None`` until ``select``
    is called with a non-empty list); there is no public accessor for the distinction.
    """
    return getattr(queues, "_consume_from", None) is not None


class WorkerQueuesStep(bootsteps.Step):
    """After Celery applied ``-Q``/``-X`` and before the consumer starts: add the
    platform's queues, or report the ones the user's selection leaves out."""

    label = "platform worker queues"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        queues = worker.app.amqp.queues
        narrowed = _narrowed_by_q(queues)
        missing: list[str] = []
        for name in platform_queues(worker.app):
            if name in queues.consume_from:
                continue
            if narrowed or name in queues:
                # -Q picked others, or the app knows the queue and -X (or the app's own
                # routing-only declaration) keeps it out: the user's choice stands.
                missing.append(name)
            else:
                # The same declaration a publisher's route creates (quorum queue and
                # topic exchange on RabbitMQ), so worker and publisher never disagree.
                queues.select_add(queues.new_missing(name))
        if missing:
            logger.warning(
                "this worker does not consume platform queue(s) %s (its -Q/-X selection "
                "leaves them out); jobs routed there wait for another worker",
                ", ".join(missing),
                extra={"event": "worker.platform_queues_not_consumed", "queues": missing},
            )


def install(app: PlatformCelery) -> None:
    """Let every worker of ``app`` consume the platform's queues unless ``-Q`` says otherwise."""
    app.steps["worker"].add(WorkerQueuesStep)
