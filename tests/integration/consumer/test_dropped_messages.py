"""Messages stock Celery would drop land in core.dead_letters, consumed by a real worker."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import redis
from kombu import Connection

from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

QUEUE = "consumer"


def valid_envelope(kind: str) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "t1",
        "correlation_id": "c1",
        "kind": kind,
        "data": {"key": "x"},
    }


def celery_headers(task: str, job_id: str) -> dict[str, Any]:
    return {
        "lang": "py",
        "task": task,
        "id": job_id,
        "root_id": job_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "eta": None,
        "expires": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "platform_attempt": 1,
    }


def rows(database_url: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT reason, job_id::text, kind, queue, payload, status, last_error "
                "FROM core.dead_letters ORDER BY id"
            )
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture
def worker(redis_url: str, database_url: str, tmp_path: Path) -> Any:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    with celery_processes() as started:
        proc = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(proc)
        proc.wait_for_log("ready.", timeout=60)
        yield proc


def publish(
    redis_url: str,
    body: Any,
    *,
    content_type: str,
    headers: dict[str, Any] | None,
    content_encoding: str = "utf-8",
) -> None:
    with Connection(redis_url) as conn:
        producer = conn.Producer()
        producer.publish(
            body,
            exchange=QUEUE,
            routing_key=QUEUE,
            content_type=content_type,
            content_encoding=content_encoding,
            headers=headers or {},
            serializer=None,
        )


def test_each_dropped_message_case_is_dead_lettered_with_its_raw_body(
    worker: CeleryProcess, redis_url: str, database_url: str, redis_client: redis.Redis
) -> None:
    unknown = valid_envelope("tests.not_registered")
    body = json.dumps(
        [[unknown], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    publish(
        redis_url,
        body,
        content_type="application/json",
        headers=celery_headers("tests.not_registered", unknown["job_id"]),
    )
    not_json_id = str(uuid.uuid4())
    publish(
        redis_url,
        b"\xff\xfenot json",
        content_type="application/json",
        content_encoding="binary",
        headers=celery_headers("tests.consumer.apply", not_json_id),
    )
    publish(
        redis_url,
        "plain words",
        content_type="text/plain",
        headers=celery_headers("tests.consumer.apply", str(uuid.uuid4())),
    )
    publish(
        redis_url, json.dumps({"hello": "world"}), content_type="application/json", headers=None
    )
    no_id = {k: v for k, v in celery_headers("tests.consumer.apply", "x").items() if k != "id"}
    publish(
        redis_url,
        json.dumps([[valid_envelope("tests.consumer.apply")], {}, {}]),
        content_type="application/json",
        headers=no_id,
    )

    wait_until(lambda: len(rows(database_url)) == 5, timeout=60, message="5 dead letters")
    by_reason = {row[0]: row for row in rows(database_url)}
    assert set(by_reason) == {
        "unknown_task",
        "undecodable_body",
        "invalid_message",
        "missing_celery_headers",
    }

    _, job_id, kind, queue, payload, status, last_error = by_reason["unknown_task"]
    assert "KeyError: 'tests.not_registered'" in last_error
    assert (job_id, kind, queue, status) == (
        unknown["job_id"],
        "tests.not_registered",
        QUEUE,
        "pending_review",
    )
    assert json.loads(payload["raw"])[0][0] == unknown
    assert payload["content_type"] == "application/json"
    assert payload["headers"]["task"] == "tests.not_registered"

    _, job_id, _, _, payload, _, _ = by_reason["undecodable_body"]
    assert job_id == not_json_id
    assert payload["raw_encoding"] == "base64"

    _, job_id, _, _, payload, _, _ = by_reason["missing_celery_headers"]
    assert job_id is None
    assert json.loads(payload["raw"]) == {"hello": "world"}

    invalid = [row for row in rows(database_url) if row[0] == "invalid_message"]
    assert sorted(row[4]["content_type"] for row in invalid) == ["application/json", "text/plain"]
    assert [row[4]["raw"] for row in invalid if row[4]["content_type"] == "text/plain"] == [
        "plain words"
    ]
    # every message was acked: nothing left on the queue or in the unacked index
    assert redis_client.llen(QUEUE) == 0
    wait_until(lambda: redis_client.hlen("unacked") == 0, timeout=10, message="all acked")


def test_dropped_message_whose_dead_letter_cannot_be_written_as_is_keeps_the_worker_alive(
    worker: CeleryProcess, redis_url: str, database_url: str, redis_client: redis.Redis
) -> None:
    """NUL in a header: jsonb and text columns refuse it; the row is stored in a safe form."""
    unknown = valid_envelope("tests.not_registered")
    body = json.dumps([[unknown], {}, {}])
    headers = dict(
        celery_headers("tests.not\x00registered", unknown["job_id"]), note="nul\x00inside"
    )
    publish(redis_url, body, content_type="application/json", headers=headers)
    wait_until(
        lambda: len(rows(database_url)) == 1,
        timeout=60,
        message="the dropped message is dead-lettered",
    )
    ((reason, job_id, kind, _, payload, _, _),) = rows(database_url)
    assert (reason, job_id) == ("unknown_task", unknown["job_id"])
    assert "\x00" not in json.dumps(payload) and "\x00" not in (kind or "")
    wait_until(lambda: redis_client.hlen("unacked") == 0, timeout=10, message="acked")
    # the worker still consumes: a second dropped message is dead-lettered too
    publish(
        redis_url,
        "plain words",
        content_type="text/plain",
        headers=celery_headers("tests.consumer.apply", str(uuid.uuid4())),
    )
    wait_until(lambda: len(rows(database_url)) == 2, timeout=60, message="worker alive")
    assert worker.running
