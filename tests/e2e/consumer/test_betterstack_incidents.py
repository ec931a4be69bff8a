"""Dead letters reach Better Stack as incidents: one per problem, resolved when fixed.

A real worker (started as the README says, Better Stack configured through its
environment) dead-letters real jobs; a Better-Stack-like HTTP server on loopback checks
the token and returns incident ids. One worker serves three scenes in turn, each driven
by flipping the server and waiting on conditions:

1. the server answers 500 while a storm of 200 dead letters of one group is written:
   every dead letter is written, no job is lost, and once the server answers one
   incident opens (further dead letters of the group open nothing);
2. the server accepts and never answers: while the sender's call hangs, jobs keep being
   applied and dead-lettered (a second group), and its incident opens once the server
   answers again;
3. replaying the storm's dead letters (a bulk operation, as the CLI and console run it)
   makes their jobs succeed and resolves the first incident with a note of the replay;
   the second group's incident stays open.
"""

from __future__ import annotations

from pathlib import Path

import psycopg2

from platform_tasks import QueuePort, create_app
from platform_tasks.operations.bulk import bulk_replay
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.betterstack_server import TOKEN, BetterStackServer
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

KIND = "tests.consumer.apply"
STORM = 200
HANG_TIMEOUT_SECONDS = 60
"""The sender's bound per call in this test: long, so the hung call is still hanging
while the jobs of scene 2 are applied and dead-lettered."""


def _scalar(database_url: str, sql: str, *params: object) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
    finally:
        conn.close()
    assert row is not None
    return int(row[0])


def _dead_letters(database_url: str, error_type: str, status: str = "pending_review") -> int:
    return _scalar(
        database_url,
        "SELECT count(*) FROM core.dead_letters WHERE error_type LIKE %s AND status = %s",
        f"%{error_type}",
        status,
    )


def _applied(database_url: str, prefix: str) -> int:
    return _scalar(
        database_url,
        "SELECT count(DISTINCT job_id) FROM public.consumer_work WHERE key LIKE %s",
        f"{prefix}%",
    )


def test_a_storm_opens_one_incident_through_an_outage_and_a_hang_and_replay_resolves_it(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
    conn.close()
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("betterstack_producer", settings=settings))

    def publish(key: str, tenant: str, **data: object) -> str:
        return str(
            port.publish(
                QUEUE,
                {"tenant_id": tenant, "kind": KIND, "data": {"key": key, **data}},
            )
        )

    with BetterStackServer() as server, celery_processes() as started:
        server.fail_with(500)
        env = platform_env(
            redis_url=redis_url,
            database_url=database_url,
            extra={
                "PLATFORM_BETTERSTACK_API_URL": server.url,
                "PLATFORM_BETTERSTACK_API_TOKEN": TOKEN,
                "PLATFORM_ALERT_SEND_INTERVAL_SECONDS": "0.2",
                "PLATFORM_ALERT_RETRY_SECONDS": "0.3",
                "PLATFORM_ALERT_TIMEOUT_SECONDS": str(HANG_TIMEOUT_SECONDS),
                # one attempt: a job that fails once is dead-lettered, and its replay
                # (the second run) succeeds
                "CONSUMER_TEST_MAX_ATTEMPTS": "1",
            },
        )
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=2),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")

        def waiting(condition: object, message: str, timeout: float = 120) -> None:
            try:
                wait_until(condition, timeout=timeout, message=message)  # type: ignore[arg-type]
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{worker.log()[-6000:]}") from exc

        # 1. a storm while Better Stack answers 500
        storm = {publish(f"storm-{n}", f"tenant-{n % 7}", fail_times=1) for n in range(STORM)}
        waiting(lambda: _dead_letters(database_url, "RuntimeError") == STORM, "the storm")
        waiting(
            lambda: server.count("POST", "/api/v2/incidents", 500) >= 3,
            "the sender retrying through the outage",
        )
        assert server.all_incidents() == []
        assert "PLATFORM_BETTERSTACK_API_URL" in worker.log(), "no start-up warning"
        server.heal()
        waiting(lambda: len(server.all_incidents()) == 1, "the storm's incident")
        (storm_incident,) = server.all_incidents()
        assert "RuntimeError" in storm_incident.summary and KIND in storm_incident.summary
        assert f"Dead letters pending review: {STORM}" in (storm_incident.description or "")
        assert "Tenants affected: 7" in (storm_incident.description or "")

        # 2. Better Stack hangs: the second group's call never gets an answer
        server.hang()
        publish("unfixable-first", "tenant-x", value_error=True)
        waiting(lambda: server.hung >= 1, "the sender's call to the hanging server")
        hung_at = len(server.requests)
        fine = [publish(f"fine-{n}", f"tenant-{n % 3}") for n in range(50)]
        unfixable = [publish(f"unfixable-{n}", "tenant-y", value_error=True) for n in range(50)]
        waiting(
            lambda: (
                _applied(database_url, "fine-") == len(fine)
                and _dead_letters(database_url, "Unfixable") == len(unfixable) + 1
            ),
            "jobs applied and dead-lettered while the sink hangs",
            timeout=HANG_TIMEOUT_SECONDS - 15,
        )
        # the call is still hanging: everything above happened during it
        assert server.hung == 1 and len(server.requests) == hung_at
        assert all(r.status == 0 for r in server.requests[hung_at - 1 :])
        server.heal()
        waiting(lambda: len(server.all_incidents()) == 2, "the second group's incident")
        assert "Unfixable" in server.all_incidents()[1].summary

        # 3. replay the storm: the jobs succeed and the first incident is resolved
        result = bulk_replay(
            settings, OperationFilter(queue=QUEUE, error_type="RuntimeError"), actor="oncall"
        )
        assert result.operation.done == STORM
        waiting(lambda: _applied(database_url, "storm-") == STORM, "the replayed jobs applied")
        waiting(lambda: storm_incident.resolved_at is not None, "the storm's incident resolved")
        note = storm_incident.resolved_by or ""
        assert f"{STORM} replayed" in note and "bulk replay operation" in note, note
        assert "oncall" in note
        open_now = server.open_incidents()
        assert [i.summary for i in open_now] == [server.all_incidents()[1].summary]
        assert len(server.all_incidents()) == 2, "one incident per group, not per job"
        assert _dead_letters(database_url, "RuntimeError", "replayed") == len(storm)
        assert TOKEN not in worker.log(), "the token was logged"
    port.close()


def test_a_token_without_its_url_stops_the_worker_naming_the_setting(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """An error, not a warning: the operator asked for incidents, and a worker that ran
    without them would lose every one silently. (An unreachable URL is a warning: see
    scene 1 above, where the worker starts while the server answers 500.)"""
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_BETTERSTACK_API_TOKEN": TOKEN},
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=1, hostname="refused@%h"),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        wait_until(
            lambda: not worker.running or "ready." in worker.log(),
            timeout=120,
            message="the worker exiting (or becoming ready)",
        )
        output = worker.log()
        assert "ready." not in output
        assert not worker.running
    assert "PLATFORM_BETTERSTACK_API_URL" in output
    assert "required when PLATFORM_BETTERSTACK_API_TOKEN is set" in output
    assert TOKEN not in output
