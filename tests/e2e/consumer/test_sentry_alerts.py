"""Dead-letter alerts reach Sentry with their tags, grouped so a storm is one issue.

A real worker sends to a Sentry DSN served by a small HTTP receiver on loopback, which
decodes the envelopes exactly as Sentry would receive them.
"""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from platform_tasks import QueuePort, create_app
from platform_tasks.harness import wait_until
from platform_tasks.settings import PlatformSettings
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv


class SentryReceiver:
    """Collects the events of Sentry envelopes POSTed to ``/api/<project>/envelope/``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                elif encoding == "br":
                    import brotli  # type: ignore[import-not-found]

                    body = brotli.decompress(body)
                lines = body.split(b"\n")
                for header, payload in zip(lines[1::2], lines[2::2], strict=False):
                    if json.loads(header).get("type") == "event":
                        receiver.events.append(json.loads(payload))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def dsn(self) -> str:
        return f"http://publickey@127.0.0.1:{self.server.server_address[1]}/1"

    def __enter__(self) -> SentryReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sentry() -> Iterator[SentryReceiver]:
    with SentryReceiver() as receiver:
        yield receiver


def test_dead_letter_alerts_carry_tags_and_one_fingerprint(
    redis_url: str, database_url: str, sentry: SentryReceiver, tmp_path: Path
) -> None:
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)
    conn.close()
    env = platform_env(redis_url=redis_url, database_url=database_url,
                       extra={"SENTRY_DSN": sentry.dsn})  # fmt: skip
    settings = PlatformSettings.build(redis_url=redis_url, database_url=database_url,
                                      profile="test")  # fmt: skip
    port = QueuePort(create_app("sentry_producer", settings=settings))
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", queues=QUEUE, concurrency=2),
            env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log",
        ).start()  # fmt: skip
        started.append(worker)
        worker.wait_for_log("ready.")
        job_ids = {
            str(port.publish(QUEUE, {"tenant_id": f"tenant-{n}", "kind": "tests.consumer.apply",
                                     "correlation_id": f"corr-{n}",
                                     "data": {"key": f"k{n}", "permanent": True}}))
            for n in range(3)
        }  # fmt: skip
        try:
            wait_until(lambda: len(sentry.events) >= 3, timeout=60, message="3 Sentry events")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
    port.close()

    events = sentry.events
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
