"""Broker messages no task can come from end as dead letters, consumed by a real worker.

Two kinds: an item on a queue list that is not a readable broker message at all (not
JSON, or JSON without kombu's delivery tag), and a message a worker took and never
acknowledged whose queue was deleted meanwhile, so the visibility sweep has nowhere to put
it back. Both become ``core.dead_letters`` rows with an alert, shown by the
``platform-tasks dead-letters`` CLI, instead of a side list in Redis that only grows or a
record that stays unacked for ever.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg2
import redis
from kombu import Connection, Exchange, Queue

from platform_tasks.brokers.transport import TRANSPORT_PATH
from platform_tasks.keys import TRANSPORT_LEGACY_QUARANTINE
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.integration.consumer.test_dropped_messages import celery_headers, valid_envelope
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

QUEUE = "consumer"
CLI = str(Path(sys.executable).parent / "platform-tasks")


def dead_letters(database_url: str, reason: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT id, job_id::text, queue, kind, payload, last_error, status "
                "FROM core.dead_letters WHERE reason = %s ORDER BY id",
                (reason,),
            )
            return list(cur.fetchall())
    finally:
        conn.close()


def start_worker(started: list[CeleryProcess], env: dict[str, str], log: Path) -> CeleryProcess:
    proc = CeleryProcess(
        worker_argv("tests.apps.consumer_app", concurrency=1), env=env, cwd=REPO_ROOT, log_path=log
    )
    started.append(proc.start())
    proc.wait_for_log("ready.", timeout=60)
    return proc


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "dead-letters", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unreadable_items_are_dead_lettered_with_their_bytes_and_an_alert(
    redis_url: str, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    foreign = {
        "content-type": "text/plain",
        "headers": {"origin": "another client"},
        "body": "hello",
    }
    items = [b"\xff\xfe\x00binary", b"plain text, not JSON", json.dumps(foreign).encode()]
    redis_client.lpush(QUEUE, *items)  # the oldest is taken first (RPOP)
    redis_client.lpush(TRANSPORT_LEGACY_QUARANTINE, b"set aside by an old version")
    env = platform_env(redis_url=redis_url, database_url=database_url)
    with celery_processes() as started:
        worker = start_worker(started, env, tmp_path / "worker.log")
        wait_until(
            lambda: len(dead_letters(database_url, "unreadable_message")) == 4,
            timeout=60,
            message="four unreadable items dead-lettered",
        )
        assert worker.running
    rows = dead_letters(database_url, "unreadable_message")
    payloads = {row[4]["raw"]: row[4] for row in rows}
    assert {row[1:3] for row in rows} == {(None, QUEUE)}, "no job id, the queue it was on"
    assert {row[6] for row in rows} == {"pending_review"}
    assert payloads[base64.b64encode(items[0]).decode()] == {
        "raw": base64.b64encode(items[0]).decode(),
        "raw_encoding": "base64",
        "content_type": None,
        "headers": {},
    }
    assert payloads["plain text, not JSON"]["content_type"] is None
    assert payloads[json.dumps(foreign)]["content_type"] == "text/plain"
    assert payloads[json.dumps(foreign)]["headers"] == {"origin": "another client"}
    assert "set aside by an old version" in payloads
    assert all("not a readable broker message" in row[5] for row in rows)
    # nothing left behind in Redis: not on the queue, not unacked, no side list
    assert redis_client.llen(QUEUE) == 0
    assert redis_client.hlen("unacked") == 0
    assert redis_client.exists(TRANSPORT_LEGACY_QUARANTINE) == 0
    assert worker.log().count("alert: job dead-lettered (unreadable_message)") == 4
    # the operator's CLI shows them
    listed = cli(env, "list")
    assert listed.returncode == 0, listed.stderr
    for row in rows:
        assert str(row[0]) in listed.stdout
    shown = cli(env, "show", str(rows[0][0]))
    assert shown.returncode == 0, shown.stderr
    assert "unreadable_message" in shown.stdout


def test_an_unacked_message_whose_queue_was_deleted_is_dead_lettered_not_kept_for_ever(
    redis_url: str, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A consumer of queue ``doomed`` took a job and was SIGKILLed; the queue was deleted.

    A worker of the consumer app (queue ``consumer``, visibility timeout 5 s) sweeps the
    expired record: nothing is bound for it any more, so it is dead-lettered (never run).
    """
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    job = valid_envelope("tests.consumer.apply")
    job_id = job["job_id"]
    body = json.dumps(
        [[job], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    doomed = Queue("doomed", Exchange("doomed", "direct"), "doomed")
    with Connection(redis_url, transport=TRANSPORT_PATH) as conn:
        # a named exchange: the anonymous one routes by queue name, deleted queue or not
        conn.Producer().publish(
            body,
            exchange=doomed.exchange,
            routing_key="doomed",
            declare=[doomed],
            content_type="application/json",
            content_encoding="utf-8",
            serializer=None,
            headers=celery_headers("tests.consumer.apply", job_id),
        )
    killed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.brokers.transport.kill_after_fetch",
            redis_url,
            TRANSPORT_PATH,
            "doomed",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert redis_client.hlen("unacked") == 1
    with Connection(redis_url, transport=TRANSPORT_PATH) as conn:  # kombu deletes the
        bound = doomed(conn.default_channel)  # bindings it knows of: declare, then delete
        bound.declare()
        bound.delete()
    assert not redis_client.keys("_kombu.binding.doomed*")
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5"},
    )
    with celery_processes() as started:
        worker = start_worker(started, env, tmp_path / "worker.log")
        wait_until(
            lambda: bool(dead_letters(database_url, "unroutable")),
            timeout=60,
            message="unroutable unacked message dead-lettered",
        )
        wait_until(lambda: redis_client.hlen("unacked") == 0, timeout=30, message="its record gone")
        assert worker.running
    ((_, dead_job_id, queue, kind, payload, last_error, _),) = dead_letters(
        database_url, "unroutable"
    )
    assert (dead_job_id, queue, kind) == (job_id, "doomed", "tests.consumer.apply")
    assert json.loads(payload["raw"])[0][0] == job
    assert "no queue is bound for exchange 'doomed'" in last_error
    assert query(database_url, "SELECT count(*) FROM public.consumer_work") == [(0,)]
    assert redis_client.llen(QUEUE) == 0
    assert "alert: job dead-lettered (unroutable)" in worker.log()
