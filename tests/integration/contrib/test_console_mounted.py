"""The console mounted in an existing Django project's admin, as docs/console.md says:
``INSTALLED_APPS`` plus the router, the project's own database as ``default`` and the
platform's as ``platform``. ``manage.py migrate`` puts nothing in the platform database,
the list reads ``core`` there, and a confirmed bulk replay (Django's test client with
CSRF checks on) is an operation in the platform's log under the project user's name;
the login throttle, added to the project's middleware, counts in the project's database.

Runs in fresh interpreters (Django settings are process-wide) against the suite's
PostgreSQL, in databases of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg2

from platform_tasks.postgres.migrations import migrate
from platform_tasks.testing.servers import PostgresServer
from tests.conftest import REPO_ROOT
from tests.support.console import insert_dead_letter
from tests.support.database import query

_CLIENT = r"""
import json, re
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.test import Client

admin = User.objects.create_superuser("root", password="unused-in-force-login")
viewer = User.objects.create_user("eve", is_staff=True)
viewer.user_permissions.set(Permission.objects.filter(
    content_type__app_label="platform_console", codename="view_deadletter"))
out = {}
client = Client(enforce_csrf_checks=True)
client.force_login(viewer)
listed = client.get("/admin/platform_console/deadletter/?tenant_id=acme")
out["viewer_list"] = listed.status_code
out["viewer_rows"] = listed.content.decode().count('class="field-tenant_id"')
out["viewer_buttons"] = "bulk-replay" in listed.content.decode()
token = client.cookies["csrftoken"].value
out["viewer_post"] = client.post("/admin/platform_console/deadletter/bulk/replay/",
                                 {"tenant_id": "acme", "csrfmiddlewaretoken": token}).status_code
client = Client(enforce_csrf_checks=True)
client.force_login(admin)
page = client.get("/admin/platform_console/deadletter/bulk/replay/?tenant_id=acme")
out["preview"] = re.search(r'id="preview-count">(\d+)<', page.content.decode()).group(1)
out["no_token"] = client.post("/admin/platform_console/deadletter/bulk/replay/",
                              {"tenant_id": "acme"}).status_code
token = client.cookies["csrftoken"].value
done = client.post("/admin/platform_console/deadletter/bulk/replay/",
                   {"tenant_id": "acme", "csrfmiddlewaretoken": token})
out["replay"] = done.status_code
out["location"] = done.headers.get("Location", "")
User.objects.create_user("ann", password="ann-Pass-for-the-console-7", is_staff=True)
logins = Client()
out["logins"] = [
    logins.post("/admin/login/", {"username": "ann", "password": password}).status_code
    for password in ("wrong-1", "wrong-2", "ann-Pass-for-the-console-7")
]
print(json.dumps(out))
"""


def _fresh(server: PostgresServer, name: str) -> str:
    conn = psycopg2.connect(server.admin_url())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return server.url.rsplit("/", 1)[0] + f"/{name}"


def test_mounted_console_reads_and_acts_on_the_platform_database(
    postgres_server: PostgresServer, redis_url: str
) -> None:
    host_url = _fresh(postgres_server, "console_host_project")
    platform_url = _fresh(postgres_server, "console_mounted_platform")
    migrate(platform_url)
    insert_dead_letter(platform_url, tenant="acme")
    insert_dead_letter(platform_url, tenant="globex")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "DJANGO_"))}
    env.update(
        HOST_DATABASE_URL=host_url,
        PLATFORM_DATABASE_URL=platform_url,
        PLATFORM_REDIS_URL=redis_url,
        PLATFORM_PROFILE="test",
        DJANGO_SETTINGS_MODULE="tests.apps.console_project.settings",
    )

    migrated = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    outside_core = query(
        platform_url,
        "SELECT schemaname, tablename FROM pg_tables WHERE "
        "schemaname NOT IN ('core', 'pg_catalog', 'information_schema')",
    )
    assert outside_core == []
    # even told to, Django migrates nothing there (only its bookkeeping table appears)
    aimed = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--database", "platform", "--verbosity", "0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert aimed.returncode == 0, aimed.stderr[-3000:]
    assert query(
        platform_url,
        "SELECT tablename FROM pg_tables WHERE schemaname NOT IN "
        "('core', 'pg_catalog', 'information_schema')",
    ) == [("django_migrations",)]
    assert query(
        host_url, "SELECT count(*) FROM auth_permission WHERE codename = 'view_dead_letter_payload'"
    ) == [(1,)]

    ran = subprocess.run(
        [sys.executable, "-c", _CLIENT],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["viewer_list"] == 200 and out["viewer_rows"] == 1
    assert out["viewer_buttons"] is False and out["viewer_post"] == 403
    assert out["preview"] == "1"
    assert out["no_token"] == 403
    assert out["replay"] == 302 and "/admin/platform_console/operation/" in out["location"]
    # the login throttle keeps its counts with the project's auth tables, not in core
    assert out["logins"] == [200, 200, 429]
    assert query(host_url, "SELECT count(*) FROM platform_console_loginfailures") == [(2,)]
    assert query(platform_url, "SELECT kind, actor, done FROM core.operations") == [
        ("replay", "root", 1)
    ]
    assert query(platform_url, "SELECT tenant_id, status FROM core.dead_letters ORDER BY 1") == [
        ("acme", "replayed"),
        ("globex", "pending_review"),
    ]
