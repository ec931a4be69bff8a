"""Alerts reach Sentry with their tags, grouped so a storm is one issue, once per problem.

A real worker sends to a Sentry DSN served by a small HTTP receiver on loopback, which
decodes the envelopes exactly as Sentry would receive them. The second case is a host
application that initialised sentry-sdk itself (its own DSN, default integrations and
``CeleryIntegration``): the platform must use that client and report each dead letter once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv
from tests.support.sentry_receiver import SentryReceiver
from tests.support.sentry_sdk_versions import SDK_MAJORS, sdk_pythonpath, sent_with


@pytest.fixture
def sentry() -> Iterator[SentryReceiver]:
    with SentryReceiver() as receiver:
        yield receiver


@pytest.mark.parametrize("sdk_major", SDK_MAJORS)
def test_dead_letter_alerts_carry_tags_and_one_fingerprint(
    redis_url: str, database_url: str, sentry: SentryReceiver, tmp_path: Path, sdk_major: str
) -> None:
    """With each supported sentry-sdk major (3.x refuses 2.x's option names), every
    dead letter is written and reaches Sentry."""
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
    conn.close()
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"SENTRY_DSN": sentry.dsn},
        pythonpath=sdk_pythonpath(sdk_major),
    )
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("sentry_producer", settings=settings))
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=2),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")
        job_ids = {
            str(
                port.publish(
                    QUEUE,
                    {
                        "tenant_id": f"tenant-{n}",
                        "kind": "tests.consumer.apply",
                        "correlation_id": f"corr-{n}",
                        "data": {"key": f"k{n}", "permanent": True},
                    },
                )
            )
            for n in range(3)
        }
        try:
            wait_until(lambda: len(sentry.events) >= 3, timeout=60, message="3 Sentry events")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
    port.close()

    events = sentry.events
    assert {sent_with(event) for event in events} == {sdk_major}
    assert {event["tags"]["job_id"] for event in events} == job_ids
    for event in events:
        tags = event["tags"]
        assert tags["queue"] == QUEUE
        assert tags["kind"] == "tests.consumer.apply"
        assert tags["tenant_id"] == f"tenant-{tags['correlation_id'].split('-')[1]}"
    fingerprints = {tuple(event["fingerprint"]) for event in events}
    assert len(fingerprints) == 1, "one failure on one queue and kind is one Sentry issue"
    (fingerprint,) = fingerprints
    assert QUEUE in fingerprint and "tests.consumer.apply" in fingerprint
    assert any("PermanentError" in part for part in fingerprint)
    for event in events:
        # the envelope's data (a Work model: key, fail_times, permanent, ...) never leaves
        # for Sentry, neither as the envelope's repr nor as the handler's local variables
        text = json.dumps(event)
        assert "Work(key=" not in text and "permanent=True" not in text, "data sent to Sentry"
        assert '"vars"' not in text, "local variables of frames were sent to Sentry"


HOST_APP = "tests.apps.sentry_host_app"


def _dead_letters_under_host_sentry(
    redis_url: str, database_url: str, tmp_path: Path, count: int
) -> tuple[set[str], SentryReceiver, SentryReceiver, str]:
    """Publish ``count`` permanently failing jobs to a worker of the host app; return the
    job ids, the host's receiver, the receiver behind ``SENTRY_DSN`` and the worker log.

    Both DSNs are set, as in a deployment that exports ``SENTRY_DSN`` for the platform
    while the application initialises Sentry with its own.
    """
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
    conn.close()
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("sentry_host_producer", settings=settings))
    with SentryReceiver() as host, SentryReceiver() as platform, celery_processes() as started:
        env = platform_env(
            redis_url=redis_url,
            database_url=database_url,
            extra={"SENTRY_DSN": platform.dsn, "HOST_SENTRY_DSN": host.dsn},
        )
        worker = CeleryProcess(
            worker_argv(HOST_APP, concurrency=2),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")
        job_ids = {
            str(
                port.publish(
                    QUEUE,
                    {
                        "tenant_id": f"tenant-{n}",
                        "kind": "tests.consumer.apply",
                        "correlation_id": f"corr-{n}",
                        "data": {"key": f"k{n}", "permanent": True},
                    },
                )
            )
            for n in range(count)
        }

        def dead_lettered() -> bool:
            return worker.log().count("job dead-lettered") >= count

        try:
            wait_until(dead_lettered, timeout=60, message=f"{count} dead letters")
            wait_until(lambda: len(host.events) >= count, timeout=30, message="host events")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
        # Stopping the worker flushes its Sentry client: whatever it was going to send
        # has arrived when the receivers are read below.
        worker.stop(timeout=30)
        log = worker.log()
    port.close()
    return job_ids, host, platform, log


def _origin(event: dict[str, Any]) -> str:
    if event.get("tags", {}).get("job_id"):
        return "platform alert"
    if event.get("logger"):
        return f"logging integration ({event['logger']})"
    mechanism = [
        v.get("mechanism", {}).get("type") for v in event.get("exception", {}).get("values", [])
    ]
    return f"exception ({','.join(str(m) for m in mechanism)})"


def test_host_initialised_sentry_is_used_and_alerts_are_not_logged_twice(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    job_ids, host, platform, log = _dead_letters_under_host_sentry(
        redis_url, database_url, tmp_path, count=2
    )
    assert platform.events == [], "the platform initialised its own client over the host's"
    origins = Counter(_origin(event) for event in host.events)
    alerts = [e for e in host.events if _origin(e) == "platform alert"]
    assert sorted(e["tags"]["job_id"] for e in alerts) == sorted(job_ids), origins
    assert not [o for o in origins if o.startswith("logging integration")], (
        f"a platform log line of an alerted problem became a second event: {origins}"
    )
    for event in alerts:
        text = json.dumps(event)
        # the host sends local variables by default; the platform's events never do
        assert '"vars"' not in text, "local variables of frames were sent to Sentry"
        assert "Work(key=" not in text and "permanent=True" not in text, "data sent to Sentry"
    assert "alert: job dead-lettered" in log, "the alert is still logged"


def test_one_event_per_dead_letter_under_celery_integration(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    job_ids, host, _, _ = _dead_letters_under_host_sentry(
        redis_url, database_url, tmp_path, count=1
    )
    origins = Counter(_origin(event) for event in host.events)
    assert len(host.events) == len(job_ids), f"one dead letter, events: {dict(origins)}"


def test_a_sentry_the_sdk_refuses_never_stops_a_dead_letter(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """A ``SENTRY_DSN`` the SDK refuses (here a DSN without its key; under a new SDK major,
    an option it no longer knows) makes alerts log-only: every dead letter is written."""
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"SENTRY_DSN": "https://sentry.invalid/42"},
    )
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    port = QueuePort(create_app("sentry_refused_producer", settings=settings))

    def dead_letters(job_ids: set[str]) -> int:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM core.dead_letters WHERE job_id::text = ANY(%s)",
                (sorted(job_ids),),
            )
            return int(cur.fetchone()[0])

    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=2),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.")
        job_ids = {
            str(
                port.publish(
                    QUEUE,
                    {
                        "tenant_id": "acme",
                        "kind": "tests.consumer.apply",
                        "data": {"key": f"refused-{n}", "permanent": True},
                    },
                )
            )
            for n in range(10)
        }
        try:
            wait_until(lambda: dead_letters(job_ids) == 10, timeout=60, message="10 dead letters")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
        log = worker.log()
    port.close()
    conn.close()
    assert "alerts are logged only" in log
    assert log.count("alert: job dead-lettered") == 10
