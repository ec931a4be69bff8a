"""Per-key limits with real ``celery worker`` processes (no ``-Q``), Redis and PostgreSQL.

Concurrency caps across two workers (counted from the start and end times the handlers
wrote in PostgreSQL), a SIGKILLed worker's slots freeing at their lease's end, waits that
spend no attempt, a throttle shared by two workers that drops nothing, and unique
publishes (skip and debounce).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.keys import concurrency_key, concurrency_waiting_key, unique_key
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.limits_app import CAP, LEASE_TTL_SECONDS, QUEUE, RUNS_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

APP = "tests.apps.limits_app"


@pytest.fixture
def port(settings: PlatformSettings) -> Iterator[QueuePort]:
    query(str(settings.database_url), RUNS_TABLE_SQL)
    query(str(settings.database_url), "TRUNCATE public.limit_runs")
    app = create_app("limits_e2e_producer", settings=settings)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


@pytest.fixture
def workers(redis_url: str, database_url: str, tmp_path: Path) -> Iterator[_Workers]:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "10"},
    )
    with celery_processes() as started:
        yield _Workers(started, env, tmp_path)


class _Workers:
    def __init__(self, started: list[CeleryProcess], env: dict[str, str], tmp: Path) -> None:
        self.started, self.env, self.tmp = started, env, tmp

    def start(self, name: str, concurrency: int = 2, *, wait: bool = True) -> CeleryProcess:
        argv = worker_argv(APP, concurrency=concurrency, hostname=f"{name}@%h")
        proc = CeleryProcess(argv, env=self.env, cwd=REPO_ROOT, log_path=self.tmp / f"{name}.log")
        self.started.append(proc.start())
        if wait:
            proc.wait_for_log("ready.", timeout=90)
        return proc


def job(kind: str, tenant: str, **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": tenant,
        "kind": f"tests.limits.{kind}",
        "data": data,
    }


def runs(database_url: str, task: str) -> list[tuple[Any, ...]]:
    return query(
        database_url,
        "SELECT job_id::text, tenant, attempt, worker, label, started_at, ended_at "
        "FROM public.limit_runs WHERE task = %s ORDER BY started_at",
        task,
    )


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The largest number of intervals open at one instant (an end before a start at a tie:
    a slot released is free for the next job)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


def test_a_cap_of_two_per_tenant_holds_across_two_workers_and_spends_no_attempt(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    workers.start("w1")
    workers.start("w2")
    tenants = {"a": 12, "b": 6}
    for tenant, count in tenants.items():
        for _ in range(count):
            port.publish(QUEUE, job("capped", tenant, hold_ms=300))
    wait_until(
        lambda: len(runs(database_url, "capped")) == sum(tenants.values()),
        timeout=120,
        message="every capped job ran",
    )
    done = runs(database_url, "capped")
    assert sorted({row[0] for row in done}) == sorted(row[0] for row in done), "each job once"
    for tenant, count in tenants.items():
        mine = [(row[5], row[6]) for row in done if row[1] == tenant]
        assert len(mine) == count
        assert most_at_once(mine) <= CAP, f"tenant {tenant}: more than {CAP} ran at once"
    # the cap was reached (so it was tested) and the jobs refused by it spent no attempt
    assert most_at_once([(row[5], row[6]) for row in done if row[1] == "a"]) == CAP
    assert {row[2] for row in done} == {1}, "a job that waited on its cap spent an attempt"
    assert len({row[3] for row in done}) == 2, "both workers ran jobs"
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
    # 4 pool processes and 12 jobs of tenant a: some were refused and waited in the store
    refusals = sum(p.log().count("throttled (concurrency_cap); attempt 1") for p in workers.started)
    assert refusals > 0, "no job was ever over its cap"
    assert redis_client.zcard(concurrency_waiting_key("test", "tests.limits.capped")) == 0


def test_a_sigkilled_workers_slots_free_when_their_leases_end(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    doomed = workers.start("doomed")
    held = [job("capped", "k", block=True, label="held") for _ in range(CAP)]
    for payload in held:
        port.publish(QUEUE, payload)
    wait_until(
        lambda: redis_client.llen("test:started") == CAP,
        timeout=60,
        message="both held jobs started on the doomed worker",
    )
    pids = {
        int(entry.decode().rsplit(":", 1)[1])
        for entry in redis_client.lrange("test:started", 0, -1)
    }
    assert pids <= set(doomed.children())
    survivor = workers.start("survivor")  # starting takes longer than the lease ttl
    slots = concurrency_key("test", "tests.limits.capped", "k")

    def redis_ms() -> int:
        seconds, micros = redis_client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # renewed while they run: both still hold a slot once the ttl they were first given
    # has passed (by Redis TIME)
    first_given = dict(redis_client.zrange(slots, 0, -1, withscores=True))
    wait_until(
        lambda: redis_ms() > max(first_given.values()) + 100,
        timeout=30,
        message="the first ttl passed",
    )
    leases = dict(redis_client.zrange(slots, 0, -1, withscores=True))
    assert {member.decode() for member in leases} == {payload["job_id"] for payload in held}
    assert min(leases.values()) > redis_ms(), "a running job's lease was not renewed"
    doomed.kill_group()
    killed_at = redis_ms()
    leases = dict(redis_client.zrange(slots, 0, -1, withscores=True))
    assert max(leases.values()) <= killed_at + LEASE_TTL_SECONDS * 1000, "a lease outlives its ttl"
    late = job("capped", "k", label="after")
    port.publish(QUEUE, late)
    wait_until(
        lambda: any(row[4] == "after" for row in runs(database_url, "capped")),
        timeout=60,
        message="a job of the same tenant ran once the slots freed",
    )
    (after,) = [row for row in runs(database_url, "capped") if row[4] == "after"]
    started_ms = int(after[5].timestamp() * 1000)
    assert started_ms >= min(leases.values()), "ran while both dead slots still held"
    assert after[2] == 1, "waiting on the dead slots spent an attempt"
    assert "survivor" in after[3]
    for payload in held:  # their redeliveries (after the visibility timeout) may finish
        redis_client.set(f"test:release:{payload['job_id']}", 1)
    wait_until(
        lambda: len(runs(database_url, "capped")) == CAP + 1,
        timeout=90,
        message="the killed jobs were redelivered and applied",
    )
    assert survivor.running


def test_a_job_over_its_cap_holds_no_worker_process(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    workers.start("w1", concurrency=CAP + 1)
    held = [job("capped", "a", block=True) for _ in range(CAP)]
    for payload in held:
        port.publish(QUEUE, payload)
    wait_until(
        lambda: redis_client.llen("test:started") == CAP,
        timeout=60,
        message="tenant a holds both its slots",
    )
    port.publish(QUEUE, job("capped", "a", label="over"))  # waits on the cap, in the store
    wait_until(
        lambda: "throttled (concurrency_cap)" in workers.started[0].log(),
        timeout=30,
        message="the third job of tenant a was put back",
    )
    # one pool process is left; the waiting job does not sit in it, so tenant b runs
    port.publish(QUEUE, job("capped", "b", label="other tenant"))
    wait_until(
        lambda: any(row[4] == "other tenant" for row in runs(database_url, "capped")),
        timeout=30,
        message="tenant b ran while tenant a's third job waited",
    )
    assert not any(row[4] == "over" for row in runs(database_url, "capped"))
    for payload in held:
        redis_client.set(f"test:release:{payload['job_id']}", 1)
    wait_until(
        lambda: any(row[4] == "over" for row in runs(database_url, "capped")),
        timeout=30,
        message="the waiting job ran once a slot freed",
    )
    (over,) = [row for row in runs(database_url, "capped") if row[4] == "over"]
    assert over[2] == 1


def test_a_throttle_of_five_per_second_holds_across_two_workers_and_drops_nothing(
    workers: _Workers, port: QueuePort, database_url: str
) -> None:
    workers.start("w1")
    workers.start("w2")
    count, per_second = 20, 5
    for _ in range(count):
        port.publish(QUEUE, job("throttled", "t"))
    port.publish(QUEUE, job("throttled", "other"))  # another key has its own bucket
    wait_until(
        lambda: len(runs(database_url, "throttled")) == count + 1,
        timeout=120,
        message="every throttled job ran",
    )
    done = [row for row in runs(database_url, "throttled") if row[1] == "t"]
    assert len(done) == count and len({row[0] for row in done}) == count
    assert {row[2] for row in done} == {1}, "a throttled job spent an attempt"
    starts = [row[5] for row in done]
    # the bucket grants at most 5 within any 1000 ms (Redis TIME); a handler starts a few
    # ms after its grant, so starts 5 apart are at least 1 s apart, less that delay
    # (allowed up to 300 ms on a loaded machine)
    gaps = [(starts[i + per_second] - starts[i]).total_seconds() for i in range(count - per_second)]
    assert min(gaps) >= 0.7, f"more than {per_second} started within a second: {gaps}"
    assert (starts[-1] - starts[0]).total_seconds() >= (count - per_second) / per_second - 0.3
    assert len({row[3] for row in done}) == 2, "both workers ran throttled jobs"


def test_a_second_unique_publish_returns_the_first_id_and_publishes_nothing(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    first = port.publish(
        QUEUE,
        job("plain", "u", label="first"),
        unique_key="sync:u",
        unique_for=timedelta(minutes=5),
    )
    second = port.publish(
        QUEUE,
        job("plain", "u", label="second"),
        unique_key="sync:u",
        unique_for=timedelta(minutes=5),
    )
    assert second == first
    assert redis_client.llen(QUEUE) == 1, "the second publish sent a message"
    workers.start("w1")
    wait_until(lambda: len(runs(database_url, "plain")) == 1, timeout=60, message="ran")
    assert [row[4] for row in runs(database_url, "plain")] == ["first"]
    # the key was released when the job started: the next publish is new work
    third = port.publish(
        QUEUE,
        job("plain", "u", label="third"),
        unique_key="sync:u",
        unique_for=timedelta(minutes=5),
    )
    assert third != first
    wait_until(lambda: len(runs(database_url, "plain")) == 2, timeout=60, message="third ran")


def test_debounce_keeps_only_the_latest_data(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    workers.start("w1")
    window = timedelta(seconds=2)
    ids = [
        port.publish(
            QUEUE,
            job("plain", "d", label=f"v{n}"),
            unique_key="reindex:d",
            unique_for=window,
            unique_mode="debounce",
        )
        for n in range(1, 4)
    ]
    assert ids[1] == ids[0] and ids[2] == ids[0]
    assert redis_client.zcard("{platform:test:delays}:v1:schedule") == 1
    wait_until(lambda: len(runs(database_url, "plain")) == 1, timeout=60, message="ran")
    ((job_id, _, _, _, label, _, _),) = runs(database_url, "plain")
    assert (job_id, label) == (str(ids[0]), "v3")
    assert redis_client.zcard("{platform:test:delays}:v1:schedule") == 0


def test_a_unique_job_that_waited_on_its_cap_releases_its_key_when_it_starts(
    workers: _Workers, port: QueuePort, database_url: str, redis_client: redis.Redis
) -> None:
    workers.start("w1", concurrency=3)
    keys = [f"sync:u{n}" for n in range(CAP + 1)]
    for key in keys:  # the third waits on the cap of tenant u, in the delay store
        port.publish(
            QUEUE, job("capped", "u", hold_ms=1500), unique_key=key, unique_for=timedelta(minutes=5)
        )
    wait_until(
        lambda: len(runs(database_url, "capped")) == len(keys), timeout=60, message="all three ran"
    )
    assert workers.started[0].log().count("throttled (concurrency_cap)") >= 1
    locks = [unique_key("platform:test", "delays", key) for key in keys]
    assert [redis_client.exists(lock) for lock in locks] == [0, 0, 0], "a started job kept its key"
