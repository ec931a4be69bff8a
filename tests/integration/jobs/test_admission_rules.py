"""Each triggering rule, driven by explicit ticks against the real Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import redis

from platform_tasks.jobs.leases import Admission, AdmissionOutcome, AdmissionRequest, JobLeases
from platform_tasks.jobs.points import to_ms
from platform_tasks.testing import JobTestScheduler
from tests.integration.jobs.conftest import RECORDING_JOB

START = datetime(2025, 1, 1, 12, 0, 7, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def runs(client: redis.Redis) -> list[dict[str, str]]:
    return [json.loads(raw) for raw in client.lrange("test:runs", 0, -1)]


def minutely(jobs_dir, redis_url: str, schedule: str = "interval=timedelta(minutes=1)"):
    return jobs_dir({"tick.py": RECORDING_JOB.format(url=redis_url, schedule=schedule)})


def test_nothing_runs_at_startup_and_first_point_is_strictly_future(
    jobs_dir, redis_url, redis_client
) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    assert scheduler.tick(at=START) == []
    assert scheduler.next_point("tick") == utc(2025, 1, 1, 12, 1)
    results = scheduler.tick(at=utc(2025, 1, 1, 12, 1, 0))
    assert [(r.job, r.point, r.outcome, r.run) for r in results] == [
        ("tick", utc(2025, 1, 1, 12, 1), "admitted", "succeeded")
    ]
    assert runs(redis_client) == [{"job": "tick", "point": "2025-01-01T12:01:00+00:00"}]


def test_start_exactly_on_a_point_does_not_run_it(jobs_dir, redis_url, redis_client) -> None:
    on_point = utc(2025, 1, 1, 12, 0)
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=on_point
    )
    assert scheduler.tick(at=on_point) == []
    assert scheduler.next_point("tick") == utc(2025, 1, 1, 12, 1)


def test_late_trigger_within_its_period_still_runs(jobs_dir, redis_url, redis_client) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    results = scheduler.tick(at=utc(2025, 1, 1, 12, 1, 59))
    assert [r.outcome for r in results] == ["admitted"]


def test_a_full_period_late_is_skipped_and_no_catch_up(jobs_dir, redis_url, redis_client) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    results = scheduler.tick(at=utc(2025, 1, 1, 12, 4, 30))
    assert [(r.point, r.outcome) for r in results] == [
        (utc(2025, 1, 1, 12, 1), "skipped_late"),
        (utc(2025, 1, 1, 12, 2), "skipped_late"),
        (utc(2025, 1, 1, 12, 3), "skipped_late"),
        (utc(2025, 1, 1, 12, 4), "admitted"),
    ]
    assert len(runs(redis_client)) == 1
    assert scheduler.next_point("tick") == utc(2025, 1, 1, 12, 5)


def test_second_replica_gets_duplicate(jobs_dir, redis_url, redis_client) -> None:
    folder = minutely(jobs_dir, redis_url)
    first = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START, owner="a")
    second = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START, owner="b")
    at = utc(2025, 1, 1, 12, 1, 1)
    assert [r.outcome for r in first.tick(at=at)] == ["admitted"]
    assert [r.outcome for r in second.tick(at=at)] == ["skipped_duplicate"]
    assert len(runs(redis_client)) == 1


def test_overlap_consumes_the_point_and_does_not_queue_it(
    jobs_dir, redis_url, redis_client
) -> None:
    folder = minutely(jobs_dir, redis_url)
    scheduler = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START)
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 1), run=False)] == ["admitted"]
    # the 12:01 run still holds the lease at 12:02
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))] == ["skipped_overlap"]
    leases = scheduler.leases
    assert leases.marker("tick") == to_ms(utc(2025, 1, 1, 12, 2))
    # finishing late: the 12:01 run's period has ended, so its start check skips it
    assert [r.run for r in scheduler.finish(at=utc(2025, 1, 1, 12, 2, 30))] == [
        "skipped_late_start"
    ]
    assert leases.lease_holder("tick") is None
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 3))] == ["admitted"]
    assert [r["point"] for r in runs(redis_client)] == ["2025-01-01T12:03:00+00:00"]


def test_worker_start_check_skips_a_trigger_that_waited_into_the_next_period(
    jobs_dir, redis_url, redis_client
) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    scheduler.tick(at=utc(2025, 1, 1, 12, 1, 10), run=False)
    assert [r.run for r in scheduler.finish(at=utc(2025, 1, 1, 12, 2))] == ["skipped_late_start"]
    assert runs(redis_client) == []


def test_handler_error_is_contained_and_next_period_runs(jobs_dir, redis_client) -> None:
    folder = jobs_dir(
        {
            "boom.py": """
        from datetime import timedelta
        from platform_tasks.jobs import define_job

        def run(ctx):
            raise RuntimeError("boom")

        define_job(handler=run, interval=timedelta(minutes=1))
    """
        }
    )
    scheduler = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START)
    first = scheduler.tick(at=utc(2025, 1, 1, 12, 1))
    assert [(r.outcome, r.run) for r in first] == [("admitted", "failed")]
    assert scheduler.leases.lease_holder("boom") is None
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))] == ["admitted"]


def test_disabled_jobs_are_not_scheduled(jobs_dir, redis_url, redis_client) -> None:
    folder = minutely(jobs_dir, redis_url, "interval=timedelta(minutes=1), enabled=False")
    scheduler = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START)
    assert len(scheduler.jobs) == 1
    assert scheduler.tick(at=utc(2025, 1, 1, 13)) == []


def test_cron_in_zone_with_ticks_across_spring_forward(jobs_dir, redis_url, redis_client) -> None:
    folder = minutely(jobs_dir, redis_url, "cron='30 2 * * *', timezone='Europe/Berlin'")
    scheduler = JobTestScheduler(
        jobs_dir=folder, redis=redis_client, started_at=utc(2025, 3, 29, 12)
    )
    assert scheduler.tick(at=utc(2025, 3, 30, 0, 59)) == []
    assert [(r.point, r.outcome) for r in scheduler.tick(at=utc(2025, 3, 30, 1))] == [
        (utc(2025, 3, 30, 1), "admitted")
    ]


def test_script_refuses_future_and_late_points_by_its_own_clock(redis_client) -> None:
    leases = JobLeases(redis_client, namespace="t")
    now = int(redis_client.time()[0]) * 1000
    future = leases.admit(
        "j", point_ms=now + 60_000, period_end_ms=now + 120_000, token="x", lease_ttl_ms=1000
    )
    assert future.outcome is AdmissionOutcome.FUTURE
    late = leases.admit(
        "j", point_ms=now - 120_000, period_end_ms=now - 60_000, token="x", lease_ttl_ms=1000
    )
    assert late.outcome is AdmissionOutcome.LATE
    assert leases.marker("j") is None
    ok = leases.admit(
        "j", point_ms=now - 1000, period_end_ms=now + 60_000, token="x", lease_ttl_ms=5000
    )
    assert ok.outcome is AdmissionOutcome.ADMITTED
    assert 0 < redis_client.pttl(leases.keys("j").lease) <= 5000
    older = leases.admit(
        "j", point_ms=now - 2000, period_end_ms=now + 60_000, token="y", lease_ttl_ms=5000
    )
    assert older.outcome is AdmissionOutcome.DUPLICATE


def test_release_and_renew_check_ownership(redis_client) -> None:
    leases = JobLeases(redis_client, namespace="t")
    now = int(redis_client.time()[0]) * 1000
    leases.admit(
        "j", point_ms=now - 10, period_end_ms=now + 60_000, token="mine", lease_ttl_ms=5000
    )
    assert leases.release("j", token="other") is False
    assert leases.renew("j", token="other", lease_ttl_ms=9000)[0].value == "lost"
    assert leases.renew("j", token="mine", lease_ttl_ms=9000)[0].value == "renewed"
    assert redis_client.pttl(leases.keys("j").lease) > 5000
    assert leases.release("j", token="mine") is True
    assert leases.lease_holder("j") is None


def test_marker_survives_completion_and_lease_expiry(jobs_dir, redis_url, redis_client) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    scheduler.tick(at=utc(2025, 1, 1, 12, 1))
    keys = scheduler.leases.keys("tick")
    assert redis_client.exists(keys.lease) == 0
    assert redis_client.ttl(keys.marker) == -1
    assert int(redis_client.get(keys.marker)) == to_ms(utc(2025, 1, 1, 12, 1))
    assert keys.marker.startswith("{") and keys.lease.startswith(keys.tag)


def test_job_scheduler_factory_fixture(job_scheduler_factory, jobs_dir, redis_url) -> None:
    scheduler = job_scheduler_factory(minutely(jobs_dir, redis_url), started_at=START)
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 1))] == ["admitted"]


def test_ticking_an_admitted_point_again_reports_a_duplicate(
    jobs_dir, redis_url, redis_client
) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    point = utc(2025, 1, 1, 12, 1)
    assert [(r.point, r.outcome, r.run) for r in scheduler.tick(at=point)] == [
        (point, "admitted", "succeeded")
    ]
    for at in (point, utc(2025, 1, 1, 12, 1, 30), utc(2025, 1, 1, 12, 1, 59, 999000)):
        assert [(r.point, r.outcome, r.run) for r in scheduler.tick(at=at)] == [
            (point, "skipped_duplicate", None)
        ]
    assert len(runs(redis_client)) == 1
    assert [(r.point, r.outcome) for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))] == [
        (utc(2025, 1, 1, 12, 2), "admitted")
    ]


def test_an_overlapped_point_ticked_again_is_a_duplicate(jobs_dir, redis_url, redis_client) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    scheduler.tick(at=utc(2025, 1, 1, 12, 1), run=False)
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))] == ["skipped_overlap"]
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2, 5))] == [
        "skipped_duplicate"
    ]


def test_nothing_at_or_before_start_up_is_considered_even_when_ticked_again(
    jobs_dir, redis_url, redis_client
) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    # 12:00 is the current point until 12:01, but it is not after start-up (12:00:07)
    for second in (7, 30, 59):
        assert scheduler.tick(at=utc(2025, 1, 1, 12, 0, second)) == []
    assert redis_client.keys("*marker*") == []


def test_ticks_move_forward(jobs_dir, redis_url, redis_client) -> None:
    scheduler = JobTestScheduler(
        jobs_dir=minutely(jobs_dir, redis_url), redis=redis_client, started_at=START
    )
    scheduler.tick(at=utc(2025, 1, 1, 12, 3))
    with pytest.raises(ValueError, match="ticks move forward"):
        scheduler.tick(at=utc(2025, 1, 1, 12, 2))


def test_redis_error_skips_the_point_and_resumes_with_future_periods(
    jobs_dir, redis_url, server_factory
) -> None:
    server = server_factory.redis()
    client = redis.Redis.from_url(server.url, socket_timeout=2)
    folder = minutely(jobs_dir, server.url)
    scheduler = JobTestScheduler(jobs_dir=folder, redis=client, started_at=START)
    server.stop()
    assert [r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 1))] == ["skipped_redis_error"]
    server.start()
    # 12:01's period is not over at 12:01:30, yet it is not retried: it stays skipped.
    assert [(r.point, r.outcome) for r in scheduler.tick(at=utc(2025, 1, 1, 12, 1, 30))] == [
        (utc(2025, 1, 1, 12, 1), "skipped_redis_error")
    ]
    assert scheduler.leases.marker("tick") is None
    assert [(r.point, r.outcome) for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))] == [
        (utc(2025, 1, 1, 12, 2), "admitted")
    ]
    client.close()


def many_jobs(jobs_dir, count: int, schedule: str = "interval=timedelta(minutes=1)"):
    source = (
        "from datetime import timedelta\n"
        "from platform_tasks.jobs import define_job\n"
        "def run(ctx): pass\n"
        f"define_job(handler=run, {schedule})\n"
    )
    return jobs_dir({f"job{i:03d}.py": source for i in range(count)})


def test_a_tick_admits_all_due_points_in_pipelined_batches(jobs_dir, redis_client) -> None:
    folder = many_jobs(jobs_dir, 25)
    scheduler = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START)
    scheduler.engine.batch_size = 10
    redis_client.config_resetstat()
    results = scheduler.tick(at=utc(2025, 1, 1, 12, 1), run=False)
    assert sorted(r.job for r in results) == [f"job{i:03d}" for i in range(25)]
    assert {r.outcome for r in results} == {"admitted"}
    stats = redis_client.info("commandstats")
    # one script call per point, three pipelines (10 + 10 + 5)
    assert stats["cmdstat_evalsha"]["calls"] == 25 and scheduler.engine.round_trips == 3
    other = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=START, owner="b")
    assert {r.outcome for r in other.tick(at=utc(2025, 1, 1, 12, 1))} == {"skipped_duplicate"}
    assert {r.run for r in scheduler.finish()} == {"succeeded"}


def test_pipelined_admission_reloads_scripts_after_a_flush(redis_client) -> None:
    leases = JobLeases(redis_client, namespace="t")
    redis_client.script_flush()
    now = int(redis_client.time()[0]) * 1000
    requests = [
        AdmissionRequest(f"j{i}", now - 10, now + 60_000, f"tok{i}", 5000) for i in range(3)
    ]
    first = leases.admit_many(requests)
    assert [a.outcome for a in first] == [AdmissionOutcome.ADMITTED] * 3  # type: ignore[union-attr]
    again = leases.admit_many(requests)
    assert [a.outcome for a in again] == [AdmissionOutcome.DUPLICATE] * 3  # type: ignore[union-attr]
    redis_client.script_flush()
    assert leases.release_many([(f"j{i}", f"tok{i}") for i in range(3)]) == [True] * 3
    assert all(leases.lease_holder(f"j{i}") is None for i in range(3))


def test_a_failed_script_call_skips_only_its_point(redis_client) -> None:
    leases = JobLeases(redis_client, namespace="t")
    redis_client.set(leases.keys("broken").marker, "not a number")
    now = int(redis_client.time()[0]) * 1000
    answers = leases.admit_many(
        [
            AdmissionRequest("ok", now - 10, now + 60_000, "a", 5000),
            AdmissionRequest("broken", now - 10, now + 60_000, "b", 5000),
        ]
    )
    assert isinstance(answers[0], Admission) and answers[0].outcome is AdmissionOutcome.ADMITTED
    assert isinstance(answers[1], redis.RedisError)


def test_redis_down_skips_every_due_point_of_the_tick_with_one_round_trip(
    jobs_dir, server_factory
) -> None:
    server = server_factory.redis()
    client = redis.Redis.from_url(server.url, socket_timeout=2)
    scheduler = JobTestScheduler(jobs_dir=many_jobs(jobs_dir, 12), redis=client, started_at=START)
    scheduler.engine.batch_size = 5
    server.stop()
    results = scheduler.tick(at=utc(2025, 1, 1, 12, 1))
    assert [r.outcome for r in results] == ["skipped_redis_error"] * 12
    assert scheduler.engine.round_trips == 1
    server.start()
    again = scheduler.tick(at=utc(2025, 1, 1, 12, 1, 30))  # not retried: still skipped
    assert [r.outcome for r in again] == ["skipped_redis_error"] * 12
    assert scheduler.engine.round_trips == 1
    assert {r.outcome for r in scheduler.tick(at=utc(2025, 1, 1, 12, 2))} == {"admitted"}
    client.close()
