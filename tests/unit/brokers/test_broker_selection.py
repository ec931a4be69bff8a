"""Broker kinds, RabbitMQ defaults and the start-up refusals, without any server."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from platform_tasks import create_app
from platform_tasks.brokers.selection import (
    broker_holds_delays,
    check_time_limits,
    delay_countdown_seconds,
)
from platform_tasks.errors import ConfigurationError
from platform_tasks.settings import PlatformSettings
from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, platform_env

AMQP = "amqp://platform:s3cret@127.0.0.1:5672/%2F"


@pytest.mark.parametrize(
    ("broker", "holds"),
    [
        (None, True),
        ("redis://127.0.0.1:6379/1", True),
        ("rediss://127.0.0.1:6380/0", True),
        (AMQP, True),
        ("pyamqp://127.0.0.1//", True),
        ("sqs://", False),
        ("memory://", False),
    ],
)
def test_broker_holds_delays(broker: str | None, holds: bool) -> None:
    settings = PlatformSettings.build(broker_url=broker)
    assert broker_holds_delays(settings) is holds


def test_a_redis_cluster_broker_is_refused_naming_the_settings() -> None:
    settings = PlatformSettings.build(
        redis_url="redis://:pw123@10.0.0.1:7000/0", redis_cluster=True
    )
    with pytest.raises(ConfigurationError) as caught:
        create_app("cluster_broker", settings=settings)
    message = str(caught.value)
    assert "PLATFORM_REDIS_CLUSTER" in message and "PLATFORM_BROKER_URL" in message
    assert "kombu has no Redis Cluster transport" in message
    assert "pw123" not in message


def test_a_cluster_for_coordination_with_rabbitmq_as_broker_is_accepted() -> None:
    settings = PlatformSettings.build(
        redis_url="redis://10.0.0.1:7000/0", redis_cluster=True, broker_url=AMQP
    )
    app = create_app("cluster_coordination", settings=settings)
    assert app.conf.broker_url == AMQP


def test_rabbitmq_gets_quorum_queues_topic_exchanges_and_confirms() -> None:
    app = create_app("amqp_defaults", settings=PlatformSettings.build(broker_url=AMQP))
    assert app.conf.task_default_queue_type == "quorum"
    assert app.conf.task_default_exchange_type == "topic"
    assert app.conf.task_create_missing_queue_type == "quorum"
    assert app.conf.task_create_missing_queue_exchange_type == "topic"
    assert app.conf.worker_detect_quorum_queues is True
    assert app.conf.broker_transport_options["confirm_publish"] is True
    assert "visibility_timeout" not in app.conf.broker_transport_options
    queue = app.amqp.queues["reports"]  # a queue created on first use, as a route does
    assert queue.queue_arguments == {"x-queue-type": "quorum"}
    assert queue.exchange.type == "topic"
    assert app.conf.task_time_limit == 1800 - 60


def test_redis_settings_are_left_as_they_were() -> None:
    app = create_app("redis_defaults", settings=PlatformSettings.build())
    assert "confirm_publish" not in app.conf.broker_transport_options
    assert app.conf.task_default_queue_type == "classic"
    assert app.conf.task_time_limit is None


def app_with_limits(name: str, limits: dict[str, float], **conf: Any) -> Any:
    """An app on RabbitMQ (``consumer_timeout`` 600 s) with one task per ``limits`` entry."""
    settings = PlatformSettings.build(broker_url=AMQP, rabbitmq_consumer_timeout_seconds=600)
    app = create_app(name, settings=settings, **conf)

    def noop() -> None: ...

    for task_name, limit in limits.items():
        app.task(name=task_name, time_limit=limit, shared=False)(noop)
    return app


def refusal(app: Any, prefetch_multiplier: int | None = None) -> str:
    """The start-up check's error for ``app``, which names the variable to change."""
    with pytest.raises(ConfigurationError) as caught:
        check_time_limits(app, prefetch_multiplier)
    message = str(caught.value)
    assert "PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS" in message
    return message


def test_a_time_limit_above_the_consumer_timeout_is_refused() -> None:
    message = refusal(app_with_limits("amqp_limits", {"tests.long": 900, "tests.short": 30}))
    assert "tests.long has time_limit=900s" in message
    assert "tests.short" not in message


def test_a_prefetch_multiplier_whose_waiting_messages_outlive_the_consumer_timeout_is_refused() -> (
    None
):
    """With 3 a message can wait behind two jobs of its process before its own run starts."""
    # the platform's own tasks get the default limit: 50 s, so 2 x 250 + 50 stays below
    app = app_with_limits(
        "amqp_prefetch",
        {"tests.report": 250, "tests.ping": 10},
        worker_prefetch_multiplier=3,
        task_time_limit=50,
    )
    message = refusal(app)
    # 2 x 250 s waiting + 250 s of its own run; 2 x 250 + 10 = 510 s stays below 600 s
    assert "tests.report can stay unacknowledged 750s" in message
    assert "worker_prefetch_multiplier=3" in message
    assert "tests.ping" not in message
    assert "--prefetch-multiplier" in message
    # the worker's own multiplier (``--prefetch-multiplier``) is the one that counts
    check_time_limits(app, prefetch_multiplier=1)
    assert "tests.ping can stay unacknowledged 760s" in refusal(app, prefetch_multiplier=4)


def test_the_platform_default_prefetch_leaves_the_time_limit_alone() -> None:
    """One message per idle process: a time limit just below the timeout is accepted."""
    app = app_with_limits("amqp_prefetch_default", {"tests.report": 599})
    assert app.conf.worker_prefetch_multiplier == 1
    check_time_limits(app)


def test_an_unlimited_prefetch_is_refused_on_rabbitmq_only() -> None:
    rabbit = app_with_limits("amqp_prefetch_unlimited", {}, worker_prefetch_multiplier=0)
    assert "worker_prefetch_multiplier=0 (no limit)" in refusal(rabbit)
    on_redis = create_app(
        "redis_prefetch_unlimited",
        settings=PlatformSettings.build(broker_url="redis://127.0.0.1:6379/1"),
        worker_prefetch_multiplier=0,
    )
    check_time_limits(on_redis)


def test_delays_round_up_to_whole_seconds_never_early() -> None:
    assert delay_countdown_seconds(0.2) == 1
    assert delay_countdown_seconds(2.0) == 2
    assert delay_countdown_seconds(2.01) == 3


def refused_worker_output(database_url: str, app: str, *args: str) -> str:
    """What ``celery -A app worker …`` printed on RabbitMQ (``consumer_timeout`` 600 s)
    before exiting with an error; the broker's port is closed, its password ``s3cret``."""
    env = platform_env(
        redis_url="redis://127.0.0.1:1/0",
        database_url=database_url,
        extra={
            "PLATFORM_BROKER_URL": "amqp://platform:s3cret@127.0.0.1:1/%2F",
            "PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS": "600",
            # no scheduled jobs: their Redis check would come first
            "PLATFORM_JOBS_ENABLED": "false",
        },
    )
    result = subprocess.run(
        [CELERY, "-A", app, "worker", "--loglevel", "INFO", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS" in output
    assert "s3cret" not in output
    return output


def test_a_worker_refuses_to_start_when_rabbitmq_would_cut_its_task(database_url: str) -> None:
    """No broker needed: the check runs while the worker is built, before it connects.

    The database is real: the worker checks (and test-connects) it first.
    """
    output = refused_worker_output(database_url, "tests.apps.long_task_app")
    assert "tests.long.report has time_limit=3600s" in output


def test_a_worker_with_a_larger_prefetch_multiplier_refuses_to_start(database_url: str) -> None:
    """``--prefetch-multiplier 2`` on the command line, the app's default time limits.

    The task's default limit (consumer_timeout - 60 s = 540 s) fits alone, but a message
    waiting behind one prefetched job first could stay unacknowledged 1,080 s. No broker
    needed (see above); the database is real.
    """
    output = refused_worker_output(
        database_url, "tests.apps.consumer_app", "--prefetch-multiplier", "2"
    )
    assert "can stay unacknowledged 1080s" in output, output
    assert "worker_prefetch_multiplier=2" in output


def test_a_task_acknowledged_on_receipt_is_not_held_against_the_consumer_timeout() -> None:
    """``platform.jobs.run`` is acked when received: RabbitMQ's consumer_timeout cannot cut
    it, so neither does the default limit derived from it (a job runs as its lease allows),
    and the start-up check leaves such tasks alone."""
    from platform_tasks.jobs.worker import RUN_TASK, RUN_TIME_LIMIT_SECONDS

    def noop() -> None: ...

    app = app_with_limits("amqp_early_ack", {})
    assert app.tasks[RUN_TASK].time_limit == RUN_TIME_LIMIT_SECONDS
    app.task(name="tests.early", acks_late=False, time_limit=900, shared=False)(noop)
    check_time_limits(app)
    app.task(name="tests.late", time_limit=900, shared=False)(noop)
    message = refusal(app)
    assert "tests.late has time_limit=900s" in message
    assert "tests.early" not in message and RUN_TASK not in message
    redis_app = create_app("redis_run_task", settings=PlatformSettings.build())
    assert redis_app.tasks[RUN_TASK].time_limit is None
