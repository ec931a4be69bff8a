"""Which queues a worker consumes: every platform queue without ``-Q``; the user's choice
with ``-Q``/``-X``, reported once.

The worker is Celery's own ``WorkController`` built in-process for the app (its queue
selection and bootsteps run exactly as under ``celery worker``; it is not started, so
nothing is consumed). The e2e test ``test_plain_worker_and_beat.py`` starts the real
commands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Queue

from platform_tasks import create_app
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.jobs.worker import runtime_of
from platform_tasks.settings import PlatformSettings

JOB = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    pass

define_job(handler=run, interval=timedelta(minutes=1){queue})
"""

EVENT = "worker.platform_queues_not_consumed"


@pytest.fixture
def make_worker(
    jobs_dir: Callable[[dict[str, str]], Path], redis_url: str, database_url: str
) -> Iterator[Callable[..., tuple[Any, list[str]]]]:
    """A WorkController for a new app. The database is real because Celery hands every new
    app the shared tasks other test modules declared (PlatformTasks among them), and a
    worker with PlatformTasks checks its database before it consumes."""
    folder = jobs_dir(
        {
            "plain.py": JOB.format(queue=""),
            "billing.py": JOB.format(queue=', queue="billing.jobs"'),
            "off.py": JOB.format(queue=', queue="never.used", enabled=False'),
        }
    )
    apps: list[Any] = []

    def make(**worker_options: Any) -> tuple[Any, list[str]]:
        celery_conf = worker_options.pop("celery_conf", {})
        settings = PlatformSettings.build(
            redis_url=redis_url, database_url=database_url, profile="test", jobs_dir=folder
        )
        app = create_app("queues_app", settings=settings, **celery_conf)
        for source in worker_options.pop("sources", ()):
            add_queue_source(app, source)
        apps.append(app)
        worker = app.WorkController(hostname="q@test", pool_cls="solo", **worker_options)
        return worker, sorted(app.amqp.queues.consume_from)

    yield make
    for app in apps:
        runtime = runtime_of(app)
        if runtime is not None:
            runtime.close()
        app.close()


RAILS = ["notif.email.marketing", "notif.email.transactional"]
"""The notification rails of the default channel: platform queues of every app too."""


def _not_consumed(caplog: pytest.LogCaptureFixture) -> list[list[str]]:
    return [
        sorted(r.queues)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", None) == EVENT
    ]


def test_without_q_the_worker_consumes_default_and_every_job_queue(
    make_worker: Callable[..., tuple[Any, list[str]]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, consumed = make_worker()
    # the disabled job's queue is not routed to, so it is not consumed
    # at least these (shared tasks other test modules declared may add their own queues)
    assert set(consumed) >= {"billing.jobs", "default", "platform.jobs", *RAILS}
    assert "never.used" not in consumed
    assert _not_consumed(caplog) == []


def test_other_platform_sources_are_consumed_too(
    make_worker: Callable[..., tuple[Any, list[str]]],
) -> None:
    _, consumed = make_worker(sources=[lambda app: ["notif.email.transactional"]])
    assert "notif.email.transactional" in consumed and "platform.jobs" in consumed


def test_with_q_the_choice_stands_and_the_left_out_job_queues_are_logged_once(
    make_worker: Callable[..., tuple[Any, list[str]]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, consumed = make_worker(queues=["billing.jobs"])
    assert consumed == ["billing.jobs"]
    [missing] = _not_consumed(caplog)
    assert set(missing) >= {"default", "platform.jobs", *RAILS}
    assert "billing.jobs" not in missing and "never.used" not in missing


def test_with_x_the_excluded_queue_stays_excluded_and_is_logged(
    make_worker: Callable[..., tuple[Any, list[str]]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, consumed = make_worker(exclude_queues=["default"])
    assert "default" not in consumed
    assert set(consumed) >= {"billing.jobs", "platform.jobs", *RAILS}
    assert _not_consumed(caplog) == [["default"]]


def test_a_queue_the_app_declares_keeps_its_declaration(
    make_worker: Callable[..., tuple[Any, list[str]]],
) -> None:
    declared = Queue("platform.jobs", routing_key="jobs.custom")
    worker, consumed = make_worker(celery_conf={"task_queues": [declared, Queue("default")]})
    assert "platform.jobs" in consumed and "billing.jobs" in consumed
    assert worker.app.amqp.queues["platform.jobs"].routing_key == "jobs.custom"
