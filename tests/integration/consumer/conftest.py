"""An in-process PlatformTask app on the shared real Redis and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg2
import pytest
from pydantic import BaseModel

from platform_tasks import PermanentError, PlatformTask, RetryPolicy, create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.settings import PlatformSettings
from tests.apps.consumer_app import WORK_TABLE_SQL

QUEUE = "consumer"
MAX_ATTEMPTS = 3


class Work(BaseModel):
    key: str
    fail: bool = False
    permanent: bool = False
    block: bool = False


@dataclass
class Harness:
    """The app, its task, and what the handler saw."""

    app: PlatformCelery
    task: Any
    database_url: str
    calls: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def apply(self, payload: Any, *, attempt: int = 1) -> Any:
        return self.task.apply(
            args=(payload,), routing_key=QUEUE, headers={"platform_attempt": attempt}
        )


@pytest.fixture
def harness(settings: PlatformSettings) -> Iterator[Harness]:
    conn = psycopg2.connect(settings.database_url)
    with conn, conn.cursor() as cur:
        cur.execute(WORK_TABLE_SQL)  # the e2e apps' table: whichever file runs first makes it
        cur.execute("TRUNCATE public.consumer_work")
    conn.close()
    app = create_app(
        "consumer_it",
        settings=settings,
        retry_policies={
            QUEUE: RetryPolicy(
                max_attempts=MAX_ATTEMPTS,
                base=timedelta(seconds=30),
                cap=timedelta(seconds=60),
                rationale="tests: three attempts are enough to see the accounting",
            )
        },
    )
    box: dict[str, Harness] = {}

    @app.task(name="tests.it.apply", base=PlatformTask, data_model=Work, shared=False)
    def apply_work(envelope: Any, tx: Any) -> str:
        h = box["h"]
        h.calls.append(str(envelope.job_id))
        tx.execute(
            "INSERT INTO public.consumer_work (job_id, key) VALUES (%s, %s)",
            (str(envelope.job_id), envelope.data.key),
        )
        if envelope.data.block:
            h.started.set()
            assert h.release.wait(30)
        if envelope.data.permanent:
            raise PermanentError("cannot ever work")
        if envelope.data.fail:
            raise RuntimeError("transient trouble")
        return "done"

    h = Harness(app=app, task=apply_work, database_url=str(settings.database_url))
    box["h"] = h
    yield h
    app.close()
