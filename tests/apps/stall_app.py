"""An app for the stall watchdog's end-to-end test: a child that runs until released.

``tests.stall.hold`` runs while ``public.stall_hold`` has a row (a PL/pgSQL loop, at most
120 s, so a failed test cannot leave a worker busy for ever); ``tests.stall.fail`` is
dead-lettered at once.
"""

from __future__ import annotations

from typing import Any

from platform_tasks import PlatformTask, create_app

QUEUE = "stall_work"
HOLD = "tests.stall.hold"
FAIL = "tests.stall.fail"

TABLES_SQL = """
CREATE TABLE IF NOT EXISTS public.stall_hold (reason text);
CREATE OR REPLACE FUNCTION public.stall_wait() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '120 seconds';
BEGIN
    WHILE EXISTS (SELECT 1 FROM public.stall_hold) AND clock_timestamp() < deadline LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
"""


class Broken(Exception):
    """Listed in permanent_errors: dead-lettered at once."""


app = create_app("stall_app", task_default_queue=QUEUE)


@app.task(name=HOLD, base=PlatformTask)
def hold(envelope: Any, tx: Any) -> None:
    tx.execute("SELECT public.stall_wait()")


@app.task(name=FAIL, base=PlatformTask, permanent_errors=(Broken,))
def fail(envelope: Any, tx: Any) -> None:
    raise Broken("this child fails for good")
