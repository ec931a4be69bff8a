"""A delay promoter for RabbitMQ that stops between confirm and removal, for fault tests.

``python -m tests.support.rabbitmq_promoter_main`` runs the production
:class:`~platform_tasks.publishing.rabbitmq_delay_promoter.RabbitMQDelayPromoter` of the
consumer test app (settings from the environment, as a worker has them) with one injected
pause point: after RabbitMQ confirmed a batch and before its entries are removed, the promoter
pushes the confirmed entry ids to the Redis list ``test:promoter:confirmed`` and waits forever,
so the test can SIGKILL it exactly there.
"""

from __future__ import annotations

import threading

import redis

from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter
from tests.apps.consumer_app import app

CONFIRMED_KEY = "test:promoter:confirmed"


def main() -> None:
    client = redis.Redis.from_url(app.platform_settings.redis_url)
    never = threading.Event()

    def pause_after_confirm(entry_ids: list[str]) -> None:
        client.rpush(CONFIRMED_KEY, *entry_ids)
        never.wait()  # until SIGKILL

    promoter = RabbitMQDelayPromoter(app, after_confirm=pause_after_confirm)
    promoter.start()
    print("promoter started", flush=True)
    never.wait()


if __name__ == "__main__":
    main()
