"""Shared set-up of the notification end-to-end tests: workers, publisher, checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv
from tests.support.resend_server import API_KEY, ResendLikeServer

APP = "tests.apps.notifications_app"
FORBIDDEN = (
    "/audiences",
    "/contacts",
    "/segments",
    "/topics",
    "/broadcasts",
    "/contact-properties",
)


@dataclass
class Rig:
    server: ResendLikeServer
    port: QueuePort
    workers: list[CeleryProcess]
    database_url: str

    def receipt(self, tenant: str, n: int) -> str:
        payload = {
            "tenant_id": tenant,
            "kind": "notify.receipt",
            "data": {"email": f"{tenant}-{n}@example.org", "n": n},
        }
        return str(self.port.publish("notif.email.transactional", payload))

    def digest(self, tenant: str, count: int, job_id: str) -> str:
        """Publish one ``notify.digest`` job of ``count`` emails under ``job_id``."""
        payload = {
            "job_id": job_id,
            "tenant_id": tenant,
            "kind": "notify.digest",
            "data": {"count": count},
        }
        return str(self.port.publish("notif.email.transactional", payload))

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def applied(self, job_id: str) -> bool:
        """Whether the job's idempotency row is committed (the job finished)."""
        return bool(self.rows("SELECT 1 FROM core.processed_jobs WHERE job_id = %s", job_id))

    def dead_letters(self) -> int:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM core.dead_letters")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def logs(self) -> str:
        return "\n".join(w.log() for w in self.workers)

    def delivered(self) -> Counter[tuple[str | None, str]]:
        """How often each (idempotency key, recipient) arrived as a new email."""
        _, emails = self.server.snapshot()
        return Counter((e.idempotency_key, r) for e in emails for r in e.to)

    def assert_exactly_once(self, expected_recipients: int) -> None:
        delivered = self.delivered()
        twice = [k for k, n in delivered.items() if n > 1]
        assert twice == [], f"sent twice: {twice[:5]}"
        recipients = Counter(r for _, r in delivered)
        assert [r for r, n in recipients.items() if n > 1] == []
        assert len(recipients) == expected_recipients
        requests, _ = self.server.snapshot()
        assert {r.path for r in requests} <= {"/emails", "/emails/batch"}
        assert not any(r.path.startswith(FORBIDDEN) for r in requests)


@contextmanager
def rig(
    redis_url: str,
    database_url: str,
    tmp_path: Path,
    *,
    workers: int = 1,
    concurrency: int = 2,
    env: Mapping[str, str] | None = None,
    server: ResendLikeServer | None = None,
    broker_url: str | None = None,
) -> Iterator[Rig]:
    """A Resend-like server, ``workers`` workers started as users start them (no ``-Q``).

    ``broker_url`` (``PLATFORM_BROKER_URL``) puts workers and publisher on another broker
    than the platform's Redis, e.g. a RabbitMQ virtual host.
    """
    resend = server or ResendLikeServer()
    with resend, celery_processes() as started:
        extra = {
            "PLATFORM_RESEND_API_KEY": API_KEY,
            "PLATFORM_RESEND_BASE_URL": resend.url,
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
            **({"PLATFORM_BROKER_URL": broker_url} if broker_url else {}),
            **(env or {}),
        }
        process_env = platform_env(redis_url=redis_url, database_url=database_url, extra=extra)
        for n in range(workers):
            worker = CeleryProcess(
                worker_argv(APP, concurrency=concurrency, hostname=f"w{n}@%h"),
                env=process_env,
                cwd=REPO_ROOT,
                log_path=tmp_path / f"worker{n}.log",
            ).start()
            started.append(worker)
        for worker in started:
            worker.wait_for_log("ready.", timeout=120)
        settings = PlatformSettings.build(
            redis_url=redis_url, broker_url=broker_url, database_url=database_url, profile="test"
        )
        app = create_app("notifications_publisher", settings=settings)
        port = QueuePort(app)
        try:
            yield Rig(resend, port, started, database_url)
        finally:
            port.close()


def key_of(job_id: Any, n: int = 0) -> str:
    return f"{job_id}:{n}"
