"""Batches with RabbitMQ as the broker: counting stays in PostgreSQL, the children and the
callbacks travel through RabbitMQ (the callbacks through the outbox's relay, with
publisher confirms), and the batch guarantees hold as on Redis.

Two workers of ``tests.apps.batch_app`` started as the README says (no ``-Q``), with
``PLATFORM_BROKER_URL`` pointing at the test's RabbitMQ virtual host. A batch of 1,000
children, 5 % failing for good, with 20 duplicates delivered on purpose; one worker is
SIGKILLed mid-run (RabbitMQ hands its unacknowledged deliveries to the other at once) and
started again. ``on_complete`` runs once, after the last child ended; ``on_death`` once;
``on_success`` not until the dead letters are fixed and replayed, then once.
"""

from __future__ import annotations

import pytest

from platform_tasks import QueuePort, create_app
from platform_tasks.headers import BATCH_HEADER
from platform_tasks.settings import PlatformSettings
from tests.apps.batch_app import QUEUE, TABLES_SQL
from tests.e2e.batches.batching import (
    assert_completed_once,
    child,
    fired,
    fix_and_replay,
    names,
    publish_batch,
)
from tests.e2e.brokers.rabbitmq.conftest import Workers, vhost_of
from tests.e2e.publishing.outbox import wait_for
from tests.support.database import query
from tests.support.servers import RabbitMQServer

CHILDREN = 1000
FAILING_EVERY = 20  # 5 % of the children fail for good
DUPLICATES = 20
APP = "tests.apps.batch_app"


@pytest.mark.slow
def test_a_batch_on_rabbitmq_fires_each_callback_once_through_a_sigkill_and_duplicates(
    broker_settings: PlatformSettings,
    workers: Workers,
    database_url: str,
    rabbitmq_server: RabbitMQServer,
) -> None:
    query(database_url, "DROP TABLE IF EXISTS public.batch_effects")
    query(database_url, TABLES_SQL)
    query(database_url, "TRUNCATE public.batch_effects, public.batch_fixed, public.batch_callbacks")
    app = create_app("rabbitmq_batch_producer", settings=broker_settings)
    port = QueuePort(app)
    try:
        payloads = [child(fail=n % FAILING_EVERY == 0) for n in range(CHILDREN)]
        batch, jobs = publish_batch(port, database_url, payloads)
        failing = {job for job, p in zip(jobs, payloads, strict=True) if p["data"]["fail"]}
        for job, payload in list(zip(jobs, payloads, strict=True))[1 : DUPLICATES + 1]:
            port.publish(
                QUEUE,
                {**payload, "job_id": str(job)},
                {"headers": {BATCH_HEADER: str(batch)}},
                tx=None,
            )

        def effects() -> int:
            return int(query(database_url, "SELECT count(*) FROM public.batch_effects")[0][0])

        one = workers.start("w1", app=APP, concurrency=2)
        two = workers.start("w2", app=APP, concurrency=2)
        wait_for(lambda: effects() >= CHILDREN // 3, timeout=120, message="progress", worker=two)
        two.kill_group()
        assert effects() < CHILDREN, "the kill must catch the batch with children left"
        workers.start("w2-again", app=APP, concurrency=2)
        wait_for(
            lambda: "complete" in names(database_url, batch),
            timeout=180,
            message="on_complete ran",
            worker=one,
        )
        assert_completed_once(database_url, batch, jobs, failing)

        fix_and_replay(port, database_url, failing)
        wait_for(
            lambda: "success" in names(database_url, batch),
            timeout=90,
            message="on_success ran after the replay",
            worker=one,
        )
        success = next(call for call in fired(database_url, batch) if call[0] == "success")
        assert success[1]["applied"] == CHILDREN

        # nothing left to run: no outbox row, no message ready or unacknowledged (acks are
        # late, so a callback that ran has committed its row)
        def drained() -> bool:
            outbox = int(query(database_url, "SELECT count(*) FROM core.outbox")[0][0])
            depths = rabbitmq_server.queue_depths(vhost_of(broker_settings))
            return outbox == 0 and not any(depths.values())

        wait_for(drained, timeout=60, message="every message consumed", worker=one)
        # each callback ran once: a second run of any would show as a second row
        assert sorted(names(database_url, batch)) == ["complete", "death", "success"]
    finally:
        port.close()
        app.close()
