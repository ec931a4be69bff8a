"""The console beyond loopback, as ``platform-tasks console --host`` starts it.

It speaks plain HTTP, so bound beyond loopback it refuses to start unless the operator
says a TLS-terminating proxy sits in front (``--behind-tls-proxy``); then its cookies are
``Secure``, the proxy's https origin is trusted, the start warns, a login through the
proxy works, and the login throttle counts the address the proxy forwards. (The tests
bind ``0.0.0.0`` and reach the console on 127.0.0.1 only.)
"""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import requests

from platform_tasks.testing.servers import PostgresServer, RedisServer, free_port, wait_until
from tests.conftest import REPO_ROOT
from tests.support.console import (
    CLI,
    OPERATOR,
    answers,
    console_database,
    console_env,
    running_console,
)
from tests.support.processes import CeleryProcess

ORIGIN = "https://console.example.test"


def test_beyond_loopback_without_a_tls_proxy_it_refuses_to_start(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    env = console_env(console_database(postgres_server), redis_server.url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = CeleryProcess(
        [CLI, "console", "--host", "0.0.0.0", "--port", str(port)],
        env=env,
        cwd=REPO_ROOT,
        log_path=tmp_path / "console.log",
    ).start()
    try:
        wait_until(
            lambda: not process.running or answers(url),
            timeout=90,
            message="the console to exit or answer",
        )
        assert not process.running, f"it serves plain HTTP on 0.0.0.0:\n{process.log()[-3000:]}"
        assert process.popen is not None and process.popen.returncode == 2
        log = process.log()
        assert "--behind-tls-proxy" in log and "PLATFORM_CONSOLE_BEHIND_TLS_PROXY" in log
        assert "beyond loopback" in log
    finally:
        process.stop(timeout=15)


def test_behind_a_tls_proxy_cookies_are_secure_the_start_warns_and_the_proxy_logs_in(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    database_url = console_database(postgres_server)
    with running_console(
        database_url,
        redis_server.url,
        tmp_path / "console.log",
        extra={
            "PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS": ORIGIN,
            "PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS": "3",
        },
        args=["--host", "0.0.0.0", "--behind-tls-proxy"],
    ) as console:
        listening = [
            c.laddr.ip
            for c in psutil.Process(console.process.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening == ["0.0.0.0"]
        assert "event=console.plain_http_beyond_loopback" in console.log()

        # what the proxy forwards: Host and Origin of the https site, the browser's cookies
        proxied = {
            "Host": "console.example.test",
            "X-Forwarded-For": "198.51.100.7",
            "X-Forwarded-Proto": "https",
        }
        page = requests.get(f"{console.url}/admin/login/", headers=proxied, timeout=10)
        assert page.status_code == 200
        set_cookie = page.headers["Set-Cookie"]
        assert "platform_console_csrftoken=" in set_cookie and "Secure" in set_cookie
        token = page.cookies["platform_console_csrftoken"]
        login = requests.post(
            f"{console.url}/admin/login/?next=/admin/",
            headers={**proxied, "Origin": ORIGIN, "Referer": f"{ORIGIN}/admin/login/"},
            cookies={"platform_console_csrftoken": token},
            data={"username": OPERATOR[0], "password": OPERATOR[1], "csrfmiddlewaretoken": token},
            allow_redirects=False,
            timeout=10,
        )
        assert login.status_code == 302 and login.headers["Location"] == "/admin/"
        session_cookie = re.search(r"platform_console_session=[^,]*", login.headers["Set-Cookie"])
        assert session_cookie and "Secure" in login.headers["Set-Cookie"]

        # the login throttle counts per client address, the one the proxy appended last:
        # three failures from 198.51.100.9 (whatever user) lock that address out
        def proxied_login(forwarded_for: str, username: str, password: str) -> int:
            headers = {**proxied, "X-Forwarded-For": forwarded_for}
            page = requests.get(f"{console.url}/admin/login/", headers=headers, timeout=10)
            token = page.cookies["platform_console_csrftoken"]
            reply = requests.post(
                f"{console.url}/admin/login/?next=/admin/",
                headers={**headers, "Origin": ORIGIN, "Referer": f"{ORIGIN}/admin/login/"},
                cookies={"platform_console_csrftoken": token},
                data={"username": username, "password": password, "csrfmiddlewaretoken": token},
                allow_redirects=False,
                timeout=30,
            )
            return reply.status_code

        for name in ("root", "administrator", "ops"):
            assert proxied_login("198.51.100.9", name, "guess") == 200
        # a client-written first entry does not change the address the proxy saw
        assert proxied_login("203.0.113.5, 198.51.100.9", *OPERATOR) == 429
        assert proxied_login("198.51.100.10", *OPERATOR) == 302
