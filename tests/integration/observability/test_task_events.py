"""The batching event dispatcher against a real Redis: when it publishes, and what.

The worker's event loop is a real kombu ``Hub`` that the test does not run; its timer
entries are fired explicitly, so no test waits for the flush interval.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.asynchronous import Hub, set_event_loop

from platform_tasks import create_app
from platform_tasks.observability.event_batching import BatchingEventDispatcher
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until


class Published:
    """Every event message on the broker's event exchange, decoded to its list of events."""

    def __init__(self, client: redis.Redis) -> None:
        self._pubsub = client.pubsub()
        self._pubsub.psubscribe("*celeryev*")
        wait_until(
            lambda: self._pubsub.get_message(timeout=0.1) is not None,
            timeout=10,
            message="subscribed",
        )

    def messages(self, expected: int, timeout: float = 10.0) -> list[tuple[str, Any]]:
        """Wait for ``expected`` messages; then check that no further one is pending."""
        found: list[tuple[str, Any]] = []

        def collect() -> bool:
            message = self._pubsub.get_message(timeout=0.1)
            if message is not None and message["type"] == "pmessage":
                envelope = json.loads(message["data"])
                body = json.loads(_decode(envelope))
                found.append((message["channel"].decode().rsplit("/", 1)[-1], body))
            return len(found) >= expected

        if expected:
            wait_until(collect, timeout=timeout, interval=0, message=f"{expected} messages")
        assert self._pubsub.get_message(timeout=0.3) is None, "no further message"
        return found


def _decode(envelope: dict[str, Any]) -> str:
    body = envelope["body"]
    if envelope["properties"].get("body_encoding") == "base64":
        return base64.b64decode(body).decode()
    return str(body)


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    set_event_loop(loop)
    try:
        yield loop
    finally:
        set_event_loop(None)
        loop.close()


@pytest.fixture
def dispatcher(settings: PlatformSettings, hub: Hub) -> Iterator[BatchingEventDispatcher]:
    app = create_app("events-unit", settings=settings)
    with app.connection_for_write() as conn:
        # What Celery's Events consumer step passes when the worker runs an event loop.
        found = app.events.Dispatcher(
            conn, hostname="w1@test", buffer_group=["task"], on_send_buffered=lambda: None
        )
        assert isinstance(found, BatchingEventDispatcher)
        yield found
        found.close()


def _fire_timers(hub: Hub) -> int:
    """Run every pending timer entry now (an explicit tick of the event loop's clock)."""
    entries = [scheduled.entry for scheduled in hub.timer.queue]
    hub.timer.clear()
    for entry in entries:
        hub.timer.apply_entry(entry)
    return len(entries)


def test_task_events_wait_for_the_timer_and_go_out_as_one_message(
    dispatcher: BatchingEventDispatcher, hub: Hub, redis_client: redis.Redis
) -> None:
    published = Published(redis_client)
    dispatcher.send("task-received", uuid="j1", name="kind.a", args="(tenant=t1)")
    dispatcher.send("task-started", uuid="j1")
    dispatcher.send("task-succeeded", uuid="j1", runtime=0.01, result="None")
    assert published.messages(0) == []
    assert len(hub.timer.queue) == 1, "one timer for the whole batch"
    assert _fire_timers(hub) == 1
    [(topic, body)] = published.messages(1)
    assert topic == "task.multi"
    assert [(e["type"], e["uuid"]) for e in body] == [
        ("task-received", "j1"),
        ("task-started", "j1"),
        ("task-succeeded", "j1"),
    ]
    assert body[0]["args"] == "(tenant=t1)" and body[2]["runtime"] == 0.01
    assert body[0]["hostname"] == "w1@test"
    assert [e["clock"] for e in body] == sorted(e["clock"] for e in body)


def test_a_full_batch_is_published_without_waiting(
    dispatcher: BatchingEventDispatcher, hub: Hub, redis_client: redis.Redis
) -> None:
    published = Published(redis_client)
    for n in range(dispatcher.max_batch):
        dispatcher.send("task-received", uuid=f"j{n}", name="kind.a")
    [(topic, body)] = published.messages(1)
    assert topic == "task.multi" and len(body) == dispatcher.max_batch
    assert _fire_timers(hub) <= 1
    assert published.messages(0) == [], "the timer finds nothing left to publish"


def test_once_stopping_every_event_is_published_at_once(
    dispatcher: BatchingEventDispatcher, hub: Hub, redis_client: redis.Redis
) -> None:
    published = Published(redis_client)
    dispatcher.send("task-received", uuid="j1", name="kind.a")
    dispatcher.flush_now()
    dispatcher.send("task-succeeded", uuid="j1", runtime=0.5)
    got = published.messages(2)
    assert [[e["type"] for e in body] for _, body in got] == [["task-received"], ["task-succeeded"]]


def test_worker_events_are_not_delayed(
    dispatcher: BatchingEventDispatcher, hub: Hub, redis_client: redis.Redis
) -> None:
    published = Published(redis_client)
    dispatcher.send("worker-heartbeat", freq=2.0)
    [(topic, body)] = published.messages(1)
    assert topic == "worker.heartbeat" and body["type"] == "worker-heartbeat"
    assert len(hub.timer.queue) == 0


def dispatcher_on_own_redis(
    server_factory: Any, name: str
) -> tuple[Any, Any, Any, BatchingEventDispatcher]:
    """A Redis of the test's own (to stop it), an app on it, its connection, and the event
    dispatcher Celery's Events step builds from that connection in a worker."""
    server = server_factory.redis()
    settings = PlatformSettings.build(
        redis_url=server.url, database_url="postgresql://unused", profile="test"
    )
    app = create_app(name, settings=settings)
    conn = app.connection_for_write()
    found = app.events.Dispatcher(
        conn, hostname="w1@test", buffer_group=["task"], on_send_buffered=lambda: None
    )
    assert isinstance(found, BatchingEventDispatcher)
    return server, app, conn, found


def test_a_batch_that_cannot_be_published_is_kept_for_the_next_connection(
    server_factory: Any, hub: Hub
) -> None:
    """Broker down at flush time: the batch stays in the dispatcher's offline buffer and
    goes out through the dispatcher Celery's Events step builds after reconnecting
    (``extend_buffer`` + ``flush``, what ``Events.start`` does with the previous one)."""
    server, app, conn, before = dispatcher_on_own_redis(server_factory, "events-offline")
    before.send("task-received", uuid="j1", name="kind.a")
    before.send("task-succeeded", uuid="j1", runtime=0.2)
    server.stop()
    before.flush_now()  # must not raise: the worker is stopping its consumer
    server.start()
    client = redis.Redis.from_url(server.url)
    published = Published(client)
    with app.connection_for_write() as fresh:
        after = app.events.Dispatcher(
            fresh, hostname="w1@test", buffer_group=["task"], on_send_buffered=lambda: None
        )
        after.extend_buffer(before)
        after.flush()
        [(topic, body)] = published.messages(1)
        after.close()
    conn.release()
    assert topic == "task.multi"
    assert [(e["type"], e["uuid"]) for e in body] == [
        ("task-received", "j1"),
        ("task-succeeded", "j1"),
    ]


def test_a_heartbeat_while_the_broker_is_down_gives_up_in_bounded_time(
    server_factory: Any, hub: Hub
) -> None:
    """Celery publishes worker heartbeats with ``retry=True`` and no retry policy, which
    kombu reads as "reconnect forever": a heartbeat due while the broker is down would hold
    the worker's event loop (acks, results, the loss of the broker connection) until the
    broker is back. Here it gives up after a few quick reconnects, keeps the event for the
    next connection, and the loop goes on."""
    server, _, conn, dispatcher = dispatcher_on_own_redis(server_factory, "events-heartbeat")
    dispatcher.send("worker-heartbeat", freq=2.0, retry=True)  # connected while Redis is up
    server.stop()
    done = threading.Event()
    failure: list[BaseException] = []

    def heartbeat() -> None:
        try:
            # what celery.worker.heartbeat.Heart sends every two seconds
            dispatcher.send("worker-heartbeat", freq=2.0, retry=True)
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=heartbeat, daemon=True).start()
    returned = done.wait(timeout=30)
    took = time.monotonic() - started
    server.start()  # lets a publish that is still retrying finish before the checks fail
    assert returned, "the heartbeat publish was still reconnecting after 30 s"
    assert failure == [], f"the heartbeat raised {failure!r}"
    assert took < 5, f"the heartbeat held its caller for {took:.1f} s"
    assert [event["type"] for event, _ in dispatcher._outbound_buffer] == ["worker-heartbeat"]
    conn.release()
