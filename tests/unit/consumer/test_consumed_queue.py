"""Where a delivery was consumed from: what retries and the retry policy are keyed on.

Built on a real app's declared queues (no server needed: the lookup reads only the app's
queue declarations and the message's ``delivery_info``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kombu import Exchange, Queue
from kombu.transport.native_delayed_delivery import calculate_routing_key

from platform_tasks import create_app
from platform_tasks.consumer.delivery import consumed_queue
from platform_tasks.settings import PlatformSettings


def _task(queue: str | None = None) -> Any:
    app = create_app(
        "consumed_queue_app",
        settings=PlatformSettings.build(redis_url="redis://127.0.0.1:1/0", profile="test"),
        task_queues=[
            Queue("default", Exchange("default"), routing_key="default"),
            Queue("ledger", Exchange("ledger"), routing_key="ledger.entries"),
        ],
    )
    return SimpleNamespace(app=app, queue=queue)


def test_a_queue_is_found_by_exchange_and_routing_key() -> None:
    task = _task()
    info = {"exchange": "ledger", "routing_key": "ledger.entries"}
    assert consumed_queue(task, info) == "ledger"


def test_a_job_back_from_rabbitmq_delayed_delivery_keeps_its_queue() -> None:
    """Celery's delayed-delivery exchange and the countdown bits say nothing of the queue."""
    task = _task()
    for countdown in (1, 88, 3600):
        info = {
            "exchange": "celery_delayed_delivery",
            "routing_key": calculate_routing_key(countdown, "ledger.entries"),
        }
        assert consumed_queue(task, info) == "ledger"
    info = {
        "exchange": "celery_delayed_delivery",
        "routing_key": calculate_routing_key(5, "default"),
    }
    assert consumed_queue(task, info) == "default"


def test_an_undeclared_queue_falls_back_to_the_tasks_own_queue() -> None:
    task = _task(queue="billing")
    info = {
        "exchange": "celery_delayed_delivery",
        "routing_key": calculate_routing_key(5, "billing"),
    }
    assert consumed_queue(task, info) == "billing"
