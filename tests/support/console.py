"""The operations console as docs/console.md starts it, and a headless Chromium to drive it.

One database (``console_e2e``) per test session in the harness PostgreSQL, migrated with
``platform-tasks migrate``; the console's own Django tables live in its schema
``console`` there and survive between tests (the suite's ``database_url`` fixture
empties every schema of the shared database, so the console does not use that one).
Each test gets the core tables emptied, its users created with
``platform-tasks console create-user`` and a ``platform-tasks console`` process of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests

from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import PostgresServer, free_port, wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, platform_env

CLI = str(Path(sys.executable).parent / "platform-tasks")
DATABASE = "console_e2e"
ADMIN_PASSWORD = "admin-Pass-for-the-console-1"
OPERATOR = ("olga", "operator-Pass-for-the-console-2")
VIEWER = ("victor", "viewer-Pass-for-the-console-3")
CORE_TABLES = ("core.dead_letters", "core.operations", "core.cancel_rules")

_url: str | None = None


def console_database(server: PostgresServer) -> str:
    """URL of the console's database: migrated once, its core tables emptied each call."""
    global _url
    if _url is None:
        url = server.url.rsplit("/", 1)[0] + f"/{DATABASE}"
        conn = psycopg2.connect(server.admin_url())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()
        subprocess.run(
            [CLI, "migrate"], env=_env_for(url), check=True, timeout=120, capture_output=True
        )
        _url = url
    conn = psycopg2.connect(_url)
    with conn, conn.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(CORE_TABLES)} RESTART IDENTITY CASCADE")
    conn.close()
    return _url


def _env_for(database_url: str, redis_url: str = "redis://127.0.0.1:1/0") -> dict[str, str]:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    return {k: v for k, v in env.items() if not k.startswith("DJANGO_")}


def insert_dead_letter(
    database_url: str,
    *,
    tenant: str,
    kind: str = "billing.charge",
    queue: str = "default",
    error: str = "ValueError: card declined",
    error_type: str = "ValueError",
    data: Any = None,
    payload: Any = None,
) -> int:
    """One pending dead letter with an envelope payload, as a consumer writes it (or with
    ``payload`` as it is: a message that was not an envelope)."""
    job_id = uuid7()
    envelope = {
        "job_id": str(job_id),
        "tenant_id": tenant,
        "correlation_id": f"corr-{job_id}",
        "kind": kind,
        "data": data if data is not None else {"amount": 100},
    }
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload, attempts,"
                " last_error, error_type, correlation_id) VALUES (%s, %s, %s, %s, %s, 3, %s, %s,"
                " %s) RETURNING id",
                (
                    str(job_id),
                    queue,
                    kind,
                    tenant,
                    json.dumps(envelope if payload is None else payload),
                    error,
                    error_type,
                    envelope["correlation_id"],
                ),
            )
            (row_id,) = cur.fetchone()  # type: ignore[misc]
    finally:
        conn.close()
    return int(row_id)


@dataclass
class Console:
    """A running ``platform-tasks console``."""

    url: str
    process: CeleryProcess
    env: dict[str, str]

    def log(self) -> str:
        return self.process.log()


def create_user(env: Mapping[str, str], username: str, password: str, role: str) -> str:
    """``platform-tasks console create-user`` as docs/console.md gives it; its output."""
    done = subprocess.run(
        [CLI, "console", "create-user", username, "--role", role],
        env={**env, "PLATFORM_CONSOLE_PASSWORD": password},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def console_env(
    database_url: str, redis_url: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment ``platform-tasks console`` is started with."""
    return {**_env_for(database_url, redis_url), **(extra or {})}


@contextmanager
def running_console(
    database_url: str,
    redis_url: str,
    log_path: Path,
    extra: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    *,
    users: bool = True,
) -> Iterator[Console]:
    """The console started with the README's command (and ``args``), an operator and a
    viewer created (unless ``users`` is false: another console on the same database)."""
    env = console_env(database_url, redis_url, extra)
    if users:
        create_user(env, *OPERATOR, "operator")
        create_user(env, *VIEWER, "viewer")
    port = free_port()
    process = CeleryProcess(
        [CLI, "console", "--port", str(port), *args],
        env={**env, "PLATFORM_CONSOLE_ADMIN_PASSWORD": ADMIN_PASSWORD},
        cwd=REPO_ROOT,
        log_path=log_path,
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: answers(url) or not process.running,
            timeout=90,
            message="the console to answer",
        )
        assert process.running, process.log()
        yield Console(url, process, env)
    finally:
        process.stop(timeout=15)


def answers(url: str) -> bool:
    with suppress(requests.RequestException):
        return requests.get(f"{url}/admin/login/", timeout=2).status_code == 200
    return False


def logged_in_session(console: Console, username: str, password: str) -> requests.Session:
    """A ``requests`` session logged in through the admin's login form (CSRF and all)."""
    session = requests.Session()
    session.get(f"{console.url}/admin/login/", timeout=10).raise_for_status()
    token = session.cookies["platform_console_csrftoken"]
    reply = session.post(
        f"{console.url}/admin/login/?next=/admin/",
        timeout=10,
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{console.url}/admin/login/"},
    )
    assert reply.url.endswith("/admin/"), f"login of {username} failed: {reply.url}"
    return session


def chromium_paths() -> tuple[str, str]:
    """Debian's chromium and chromedriver (``scripts/bootstrap`` installs them)."""
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [path for path in (browser, driver) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: run ./scripts/bootstrap (it installs "
            "Debian's chromium and chromium-driver)"
        )
    return browser, driver


@contextmanager
def headless_chromium(download_dir: Path) -> Iterator[Any]:
    """A selenium WebDriver on headless Chromium; quit at exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        f"--user-data-dir={download_dir / 'profile'}",
    ):
        options.add_argument(argument)
    service = Service(executable_path=driver, log_output=str(download_dir / "chromedriver.log"))
    web = webdriver.Chrome(options=options, service=service)
    web.set_page_load_timeout(60)
    try:
        yield web
    finally:
        web.quit()


def query(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    from tests.support.database import query as run

    return run(database_url, sql, *params)
