"""The batch scenarios' shared parts: publishing a batch with its three callbacks, and
reading back what the children and callbacks of ``tests.apps.batch_app`` recorded."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

import psycopg2

from platform_tasks import QueuePort
from platform_tasks.batches import Callback
from platform_tasks.dead_letters.store import replay_dead_letters
from tests.apps.batch_app import CALLBACK, CHILD, QUEUE
from tests.support.database import query


def cb(name: str) -> Callback:
    return Callback(QUEUE, CALLBACK, "t1", {"name": name})


def child(tenant: str = "t1", **data: Any) -> dict[str, Any]:
    return {"tenant_id": tenant, "kind": CHILD, "data": data}


def fired(database_url: str, batch: uuid.UUID) -> list[tuple[str, dict[str, int], datetime]]:
    return [
        (name, counts, ran_at)
        for name, counts, ran_at in query(
            database_url,
            "SELECT name, counts, ran_at FROM public.batch_callbacks WHERE batch_id = %s "
            "ORDER BY ran_at",
            str(batch),
        )
    ]


def names(database_url: str, batch: uuid.UUID) -> list[str]:
    return [name for name, _, _ in fired(database_url, batch)]


def last_effect(database_url: str, jobs: list[uuid.UUID]) -> datetime:
    value = query(
        database_url,
        "SELECT max(applied_at) FROM public.batch_effects WHERE job_id = ANY(%s::uuid[])",
        [str(job) for job in jobs],
    )[0][0]
    assert isinstance(value, datetime)
    return value


def publish_batch(
    port: QueuePort, database_url: str, payloads: list[dict[str, Any]], **run_at: Any
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    conn = psycopg2.connect(database_url)
    with (
        conn,
        conn.cursor() as cur,
        port.batch(
            on_complete=cb("complete"),
            on_success=cb("success"),
            on_death=cb("death"),
            description="e2e",
            tx=cur,
        ) as batch,
    ):
        jobs = [
            batch.schedule(QUEUE, p, run_at["due"])
            if p.get("tenant_id") == "t-later"
            else batch.publish(QUEUE, p)
            for p in payloads
        ]
    conn.close()
    return batch.id, jobs


def assert_completed_once(
    database_url: str, batch: uuid.UUID, jobs: list[uuid.UUID], failing: Collection[uuid.UUID]
) -> None:
    """``on_complete`` and ``on_death`` ran once each (no ``on_success``), ``on_complete``
    with the counts of a batch whose ``failing`` children were dead-lettered and after
    the last child ended, and no child was applied twice."""
    assert sorted(names(database_url, batch)) == ["complete", "death"]
    complete = next(call for call in fired(database_url, batch) if call[0] == "complete")
    assert complete[1] == {
        "applied": len(jobs) - len(failing),
        "dead_lettered": len(failing),
        "discarded": 0,
        "cancelled": 0,
        "total": len(jobs),
    }
    assert complete[2] > last_effect(database_url, jobs), "after the last child ended"
    doubled = query(
        database_url,
        "SELECT count(*) FROM (SELECT job_id FROM public.batch_effects "
        "WHERE job_id = ANY(%s::uuid[]) GROUP BY job_id HAVING count(*) > 1) d",
        [str(job) for job in jobs if job not in failing],
    )[0][0]
    assert doubled == 0, "no child applied twice"


def fix_and_replay(port: QueuePort, database_url: str, failing: Collection[uuid.UUID]) -> None:
    """Fix the failing children (``public.batch_fixed``) and replay every dead letter."""
    for job in failing:
        query(database_url, "INSERT INTO public.batch_fixed VALUES (%s)", str(job))
    conn = psycopg2.connect(database_url)
    try:
        replay_dead_letters(conn, port.publish, ids=None)
    finally:
        conn.close()
