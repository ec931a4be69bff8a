"""Soak: thousands of jobs through a prefork worker, with failures, duplicates and poison.

A deterministic hash of each job_id picks its fate (succeed, fail once or twice then
succeed, fail every attempt, fail permanently); some jobs are published twice with the
same job_id; invalid envelopes and messages naming no task are mixed in. The assertion is
the accounting afterwards: every published job_id is applied exactly once (one effect
row, one idempotency row) or is exactly one dead-letter row with the right reason and
attempt count, and nothing else exists: no other rows, nothing queued, nothing delayed.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks.envelope import uuid7
from tests.apps.fault_app import MAX_ATTEMPTS, QUEUE, TASK, runs_key
from tests.conftest import ServerFactory
from tests.e2e.consumer.faults import (
    broker_lists,
    count,
    delays_pending,
    effect_payload,
    prepare_effects,
    producer,
    query,
    start_worker,
    wait_for,
)
from tests.support.processes import celery_processes

JOBS = 2000
POISON = 40
UNKNOWN = 10
UNKNOWN_KIND = "tests.faults.no_such_task"


@dataclass(frozen=True)
class Fate:
    """What a job_id's hash decided, and what must be true of it afterwards."""

    fail_times: int = 0
    permanent: bool = False
    duplicate: bool = False

    @property
    def applied(self) -> bool:
        return not self.permanent and self.fail_times < MAX_ATTEMPTS

    @property
    def expected_runs(self) -> int:
        """Handler runs counted by the app (only jobs that fail are counted)."""
        if self.permanent:
            return 1
        if self.fail_times == 0:
            return 0
        return min(self.fail_times + 1, MAX_ATTEMPTS)


def fate_of(job_id: str) -> Fate:
    digest = hashlib.sha256(job_id.encode()).digest()
    bucket = digest[0] % 100
    duplicate = digest[1] % 10 == 0
    if bucket < 70:
        return Fate(duplicate=duplicate)
    if bucket < 85:
        return Fate(fail_times=1, duplicate=duplicate)
    if bucket < 90:
        return Fate(fail_times=2, duplicate=duplicate)
    if bucket < 95:
        return Fate(fail_times=MAX_ATTEMPTS, duplicate=duplicate)
    return Fate(permanent=True, duplicate=duplicate)


def poison_envelope(n: int) -> dict[str, Any]:
    """A message the queue port would refuse: published raw, it must be dead-lettered."""
    bad: dict[str, Any] = {
        "job_id": str(uuid7()),
        "tenant_id": "tenant-1",
        "correlation_id": f"poison-{n}",
        "kind": TASK,
        "data": {},
    }
    if n % 2:
        bad["tenant_id"] = "not a valid tenant!"
    else:
        bad["data"] = {"fail_times": "many"}
    return bad


def dead_letters(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    rows = query(
        database_url,
        "SELECT job_id::text, reason, attempts, status, queue, payload FROM core.dead_letters",
    )
    by_job: dict[str, list[tuple[Any, ...]]] = {}
    for job_id, *rest in rows:
        by_job.setdefault(job_id, []).append(tuple(rest))
    return by_job


@pytest.mark.slow
def test_soak_every_job_applied_once_or_dead_lettered_once(
    server_factory: ServerFactory, database_url: str, tmp_path: Path
) -> None:
    prepare_effects(database_url)
    broker = server_factory.redis(appendfsync="always")
    client = redis.Redis.from_url(broker.url)

    jobs = {p["job_id"]: p for p in (effect_payload() for _ in range(JOBS))}
    fates = {job_id: fate_of(job_id) for job_id in jobs}
    for job_id, fate in fates.items():
        # every field of the model, so a dead letter's payload (the envelope as the last
        # attempt carried it) compares equal to what was published
        jobs[job_id]["data"] = {
            "hold_ms": 0,
            "gate": 0,
            "fail_times": fate.fail_times,
            "permanent": fate.permanent,
        }
    poison = [poison_envelope(n) for n in range(POISON)]
    unknown = [effect_payload() | {"kind": UNKNOWN_KIND} for _ in range(UNKNOWN)]

    sends: list[tuple[str, dict[str, Any]]] = [("publish", p) for p in jobs.values()]
    sends += [("publish", jobs[j]) for j, fate in fates.items() if fate.duplicate]
    sends += [("raw", p) for p in poison] + [("publish", p) for p in unknown]
    random.Random(3).shuffle(sends)

    applied = {j for j, f in fates.items() if f.applied}
    exhausted = {j for j, f in fates.items() if not f.permanent and not f.applied}
    permanent = {j for j, f in fates.items() if f.permanent}
    expected: dict[str, tuple[str, int]] = {}  # job_id -> (dead-letter reason, attempts)
    expected |= {j: ("retries_exhausted", MAX_ATTEMPTS) for j in exhausted}
    expected |= {j: ("permanent_error", 1) for j in permanent}
    expected |= {p["job_id"]: ("poison", 1) for p in poison}
    expected |= {p["job_id"]: ("unknown_task", 0) for p in unknown}
    published = set(jobs) | {p["job_id"] for p in poison + unknown}
    # the mix must really contain every case, or the test proves less than it claims
    assert min(len(exhausted), len(permanent)) > 20
    assert sum(f.duplicate for f in fates.values()) > 100
    assert sum(f.fail_times in (1, 2) for f in fates.values()) > 200

    def effect_ids() -> Counter[str]:
        return Counter(j for (j,) in query(database_url, "SELECT job_id::text FROM public.effects"))

    def unsettled() -> set[str]:
        return published - set(effect_ids()) - set(dead_letters(database_url))

    def settled() -> bool:
        """Every job has a verdict and nothing is queued or delayed any more."""
        return not unsettled() and not broker_lists(client) and delays_pending(client) == 0

    def describe() -> dict[str, Any]:
        waiting = sorted(unsettled())
        return {
            "without_verdict": len(waiting),
            "examples": [(j, fates.get(j)) for j in waiting[:5]],
            "lists": broker_lists(client),
            "delays": delays_pending(client),
        }

    with celery_processes() as started:
        worker = start_worker(
            started,
            redis_url=broker.url,
            database_url=database_url,
            log_path=tmp_path / "worker.log",
        )
        with producer(broker.url, database_url) as (app, port):
            for how, payload in sends:
                if how == "raw":
                    app.send_task(
                        TASK,
                        args=[payload],
                        task_id=payload["job_id"],
                        queue=QUEUE,
                        headers={"platform_attempt": 1},
                    )
                else:
                    port.publish(QUEUE, payload)
        wait_for(
            settled,
            timeout=120,
            message="a verdict for every job",
            worker=worker,
            describe=describe,
        )
        worker.stop()  # warm: deliveries still running (duplicates) finish first

    runs_of = dict(zip(fates, client.mget([runs_key(j) for j in fates]), strict=True))

    def detail(job_ids: set[str]) -> list[tuple[str, Fate | None, Any]]:
        return [(j, fates.get(j), runs_of.get(j)) for j in sorted(job_ids)[:10]]

    # applied exactly once: one effect row and one idempotency row each, nothing else
    effects = effect_ids()
    assert detail(set(effects) - applied) == [], "applied, but should have been dead-lettered"
    assert detail(applied - set(effects)) == [], "never applied"
    assert detail({j for j, n in effects.items() if n != 1}) == [], "applied more than once"
    processed = query(database_url, "SELECT job_id::text, consumer FROM core.processed_jobs")
    assert sorted(processed) == sorted((j, TASK) for j in applied)

    # dead-lettered exactly once, with the reason and attempt count of its fate
    dead = dead_letters(database_url)
    assert detail({j for j, rows in dead.items() if len(rows) != 1}) == [], "several dead letters"
    actual = {}
    for job_id, ((reason, attempts, status, queue, stored), *_) in dead.items():
        assert (status, queue) == ("pending_review", QUEUE), job_id
        if job_id in jobs:
            assert stored["data"] == jobs[job_id]["data"], job_id
        actual[job_id] = (reason, attempts)
    wrong = {
        j: (actual.get(j), expected.get(j))
        for j in set(actual) | set(expected)
        if actual.get(j) != expected.get(j)
    }
    assert wrong == {}, "dead letters (actual, expected)"
    assert count(database_url, "core.dead_letters") == len(expected)

    # the handler ran exactly as often as each fate allows, never past max_attempts
    wrong_runs = {j for j, f in fates.items() if int(runs_of[j] or 0) != f.expected_runs}
    assert detail(wrong_runs) == [], "handler runs (job, fate, runs)"

    # nothing left waiting: no queue or other list holds a message, no delay is pending
    assert broker_lists(client) == {}
    assert delays_pending(client) == 0
    client.close()
