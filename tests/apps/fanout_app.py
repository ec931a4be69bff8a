"""An app for fan-out end-to-end tests: ``create_app`` (which installs the fan-out), one
tenant consumer.

The consumer records every application of a tenant job as a row of
``public.fanout_applied`` (no unique key: a job applied twice would show as two rows);
``fanout_test.all_done`` (a fan-out's ``on_complete``) one row of
``public.fanout_completed`` per application.
The fan-out queue gets a short retry policy so a failing fan-out reaches the dead
letters within the test.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from platform_tasks import PlatformTask, RetryPolicy, create_app
from platform_tasks.fanout import FANOUT_QUEUE

WORK_QUEUE = "fanout_work"
KIND = "fanout_test.apply"
DONE_KIND = "fanout_test.all_done"

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS public.fanout_applied (
    job_id uuid NOT NULL, tenant_id text NOT NULL, point text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS public.fanout_hold (reason text);
CREATE TABLE IF NOT EXISTS public.fanout_completed (
    job_id uuid NOT NULL, batch_id text NOT NULL, counts jsonb NOT NULL,
    applied_before bigint NOT NULL, completed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS public.fanout_fail (reason text);
CREATE OR REPLACE FUNCTION public.fanout_gate(tenant text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF tenant = 't-0500' THEN
        IF EXISTS (SELECT 1 FROM public.fanout_fail) THEN
            RAISE EXCEPTION 'tenant source failed at %', tenant;
        END IF;
        WHILE EXISTS (SELECT 1 FROM public.fanout_hold) LOOP
            PERFORM pg_sleep(0.05);
        END LOOP;
    END IF;
    RETURN true;
END $$;
"""

GATED_TENANTS_QUERY = (
    "SELECT tenant_id, freshness_tier FROM core.tenants "
    "WHERE active AND public.fanout_gate(tenant_id)"
)
"""A tenants query whose stream stops before tenant ``t-0500`` while ``fanout_hold`` has a
row, and fails there while ``fanout_fail`` has one."""

app = create_app(
    "fanout_app",
    retry_policies={
        FANOUT_QUEUE: RetryPolicy(
            max_attempts=3,
            base=timedelta(seconds=1),
            cap=timedelta(seconds=2),
            rationale="tests: a failing fan-out reaches the dead letters within seconds",
        )
    },
    task_default_queue=WORK_QUEUE,
)


@app.task(base=PlatformTask, name=KIND)
def apply(envelope: Any, tx: Any) -> None:
    tx.execute(
        "INSERT INTO public.fanout_applied (job_id, tenant_id, point) VALUES (%s, %s, %s)",
        (str(envelope.job_id), envelope.tenant_id, envelope.data["scheduled_for"]),
    )


@app.task(base=PlatformTask, name=DONE_KIND)
def all_done(envelope: Any, tx: Any) -> None:
    """A fan-out's ``on_complete``: records each application with the tenant jobs applied
    by then (every one of them, if it fired after the last ended)."""
    tx.execute(
        "INSERT INTO public.fanout_completed (job_id, batch_id, counts, applied_before)"
        " SELECT %s, %s, %s, count(*) FROM public.fanout_applied",
        (str(envelope.job_id), envelope.data["batch_id"], json.dumps(envelope.data["counts"])),
    )
