"""The consumer's limits hook against a real Redis: waits, releases, metrics, outages."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from platform_tasks import PlatformTask, create_app
from platform_tasks.envelope import parse_envelope, uuid7
from platform_tasks.errors import ServersUnavailable, Throttled
from platform_tasks.limits import admission
from platform_tasks.limits.admission import admit, runtime_for
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until

_names = itertools.count()


@pytest.fixture
def capped(settings: PlatformSettings) -> Iterator[Any]:
    app = create_app("limits_admission", settings=settings)
    name = f"t.admission{next(_names)}"

    @app.task(
        name=name,
        base=PlatformTask,
        shared=False,
        max_concurrency=1,
        concurrency_key=lambda envelope: envelope.tenant_id,
        throttle_key=lambda envelope: envelope.tenant_id,
        throttle="1/min",
    )
    def handler(envelope: Any, tx: Any) -> None: ...

    yield app.tasks[name]
    app.close()


def envelope(tenant: str) -> Any:
    return parse_envelope(
        {
            "job_id": str(uuid7()),
            "tenant_id": tenant,
            "kind": "t.admission",
            "correlation_id": "c",
            "data": {},
        }
    )


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def sample(name: str, task: str) -> float:
    value = REGISTRY.get_sample_value(name, {"task": task})
    return 0.0 if value is None else value


def test_over_the_cap_waits_from_redis_time_and_a_release_frees_the_slot(
    capped: Any, redis_client: redis.Redis
) -> None:
    refused_before = sample("platform_jobs_cap_refused_total", capped.name)
    first = admit(capped, envelope("a"))
    before = redis_ms(redis_client)
    with pytest.raises(Throttled) as raised:
        admit(capped, envelope("a"))
    after = redis_ms(redis_client)
    assert raised.value.reason == "concurrency_cap"
    # concurrency_retry (1 s) plus up to half of it, counted from Redis TIME
    due = raised.value.retry_at.timestamp() * 1000
    assert before + 1000 <= due <= after + 1500
    assert sample("platform_jobs_cap_refused_total", capped.name) == refused_before + 1
    assert sample("platform_jobs_waiting_on_cap", capped.name) == 1
    first.release()
    second = admit(capped, envelope("b"))  # another tenant: its own slot (and bucket)
    second.release()


def test_a_throttle_refusal_gives_the_slot_back(capped: Any, redis_client: redis.Redis) -> None:
    admit(capped, envelope("c")).release()  # takes the one token of 1/min
    with pytest.raises(Throttled) as raised:
        admit(capped, envelope("c"))
    assert raised.value.reason == "throttle"
    keys = redis_client.keys("platform:test:limits:v1:concurrency:*:c")
    assert all(redis_client.zcard(key) == 0 for key in keys), "a throttled job kept its slot"


def test_a_limit_that_cannot_ask_redis_waits(settings: PlatformSettings) -> None:
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    app = create_app("limits_admission_down", settings=down)
    name = f"t.admission{next(_names)}"

    @app.task(
        name=name,
        base=PlatformTask,
        shared=False,
        max_concurrency=1,
        concurrency_key=lambda envelope: envelope.tenant_id,
    )
    def handler(envelope: Any, tx: Any) -> None: ...

    try:
        with pytest.raises(ServersUnavailable):
            admit(app.tasks[name], envelope("a"))
    finally:
        app.close()


def test_a_throttled_job_whose_token_is_near_waits_for_it_in_place(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    """Through the delay store a refused job comes back at its slot give or take the
    promoter's and the fetch's jitter; a few ms early it was refused again and sent behind
    every job refused meanwhile, leaving its token unused (a 5/s throttle ran at 3/s). A
    token within THROTTLE_WAIT_IN_PLACE_MS is waited for where the job is, by Redis TIME."""
    app = create_app("limits_admission_in_place", settings=settings)
    name = f"t.admission{next(_names)}"

    @app.task(
        name=name,
        base=PlatformTask,
        shared=False,
        throttle_key=lambda envelope: envelope.tenant_id,
        throttle="5/s",
    )
    def handler(envelope: Any, tx: Any) -> None: ...

    waits: list[float] = []

    def wait_on_redis_time(seconds: float) -> None:
        waits.append(seconds)
        until = redis_ms(redis_client) + seconds * 1000
        wait_until(lambda: redis_ms(redis_client) >= until, timeout=5, interval=0.005)

    runtime_for(app).sleep = wait_on_redis_time
    task = app.tasks[name]
    try:
        start = redis_ms(redis_client)
        for _ in range(4):  # the bucket's one token, then one every 200 ms: each waited for
            admit(task, envelope("near")).release()
        # never over the limit: the 4th token is 600 ms after the first (Redis TIME, ms)
        assert redis_ms(redis_client) - start >= 598
        assert len(waits) >= 3
        assert all(0 < wait <= admission.THROTTLE_WAIT_IN_PLACE_MS / 1000 for wait in waits)
    finally:
        app.close()


def test_closing_the_app_closes_its_limits_connection_and_stops_renewing_leases(
    capped: Any, redis_client: redis.Redis
) -> None:
    """An app made at run time (a test's, a script's) gives back what its limits opened in
    this process when it is closed: the Redis connection and the lease renewal thread."""
    admitted = admit(capped, envelope("closing"))
    runtime = runtime_for(capped.app)
    connection_id = runtime.client().client_id()
    renewer = runtime.renewer._thread
    assert renewer is not None and renewer.is_alive()
    admitted.release()

    capped.app.close()

    def connection_open() -> bool:
        return any(int(client["id"]) == connection_id for client in redis_client.client_list())

    wait_until(lambda: not connection_open(), timeout=5, message="limits connection closed")
    renewer.join(timeout=5)
    assert not renewer.is_alive()
    assert runtime_for(capped.app) is not runtime  # a later job opens new connections
