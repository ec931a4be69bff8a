"""Worker module of ``bench/celery_baselines.py``: a Dramatiq no-op actor on the same Redis.

Run as ``dramatiq bench.dramatiq_app --processes 2 --threads 8``; Dramatiq's Redis broker
with its default middleware, as its documentation sets it up.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ["PLATFORM_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="default", max_retries=0)
def noop() -> None:
    """Does nothing: only the broker path and Dramatiq's own work are measured."""
