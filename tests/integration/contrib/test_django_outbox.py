"""A Django view publishing inside ``transaction.atomic`` with ``atomic_tx()``: a view that
raises after publishing leaves no job; one that returns leaves exactly its job, which a
relay then hands to the broker. Django runs in a fresh interpreter (its settings are
process-wide) against the suite's PostgreSQL and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from platform_tasks import create_app
from platform_tasks.publishing.outbox_relay import OutboxRelay
from platform_tasks.settings import PlatformSettings
from tests.conftest import REPO_ROOT
from tests.support.database import query

_CLIENT = r"""
import json
import django
django.setup()
from django.test import Client
from tests.apps.outbox_django.urls import PUBLISHED

client = Client(raise_request_exception=False)
out = {}
out["failed_status"] = client.get("/order/", {"fail": "1"}).status_code
out["failed_job"] = PUBLISHED[-1]
ok = client.get("/order/")
out["ok_status"] = ok.status_code
out["ok_job"] = ok.content.decode()
outside = client.get("/outside/")
out["outside"] = [outside.status_code, outside.content.decode()]
print(json.dumps(out))
"""


def test_a_view_that_raises_after_publishing_leaves_no_job(
    settings: PlatformSettings, redis_url: str, database_url: str, redis_client
) -> None:  # type: ignore[no-untyped-def]
    query(database_url, "DROP TABLE IF EXISTS public.django_orders")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")},
        "DJANGO_SETTINGS_MODULE": "tests.apps.outbox_django.settings",
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_REDIS_URL": redis_url,
        "PLATFORM_PROFILE": "test",
    }
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["failed_status"] == 500
    assert out["ok_status"] == 200
    assert out["outside"][0] == 409
    assert "OutboxTransactionError" in out["outside"][1]
    assert "transaction.atomic()" in out["outside"][1]

    rows = [r[0] for r in query(database_url, "SELECT job_id::text FROM core.outbox")]
    assert rows == [out["ok_job"]], "only the committed view's job exists"
    assert query(database_url, "SELECT count(*) FROM public.django_orders")[0][0] == 1

    app = create_app("django_outbox_relay", settings=settings)
    relay = OutboxRelay(app, metrics=False)
    try:
        assert relay.run_once() == 1
    finally:
        relay.close()
        app.close()
    pushed = [json.loads(raw)["headers"]["id"] for raw in redis_client.lrange("orders", 0, -1)]
    assert pushed == [out["ok_job"]]
    assert out["failed_job"] not in pushed
