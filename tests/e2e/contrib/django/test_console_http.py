"""The console's HTTP contract, against one ``platform-tasks console`` process on the
harness PostgreSQL and Redis (``requests``, logged in through the admin's login form).

CSRF is enforced on every action, a GET never acts, each action is a row in the
operations log with the logged-in user as actor, a search cannot select a bulk action's
rows, the payload's data needs its permission, stored text is escaped, the console's
Django tables stay out of schema ``core``, and passwords never reach the output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from platform_tasks.testing.servers import PostgresServer, RedisServer
from tests.support.console import (
    ADMIN_PASSWORD,
    OPERATOR,
    VIEWER,
    Console,
    console_database,
    create_user,
    insert_dead_letter,
    logged_in_session,
    query,
    running_console,
)

BASE = "/admin/platform_console"


@pytest.fixture(scope="module")
def console(
    postgres_server: PostgresServer,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Console]:
    database_url = console_database(postgres_server)
    log = tmp_path_factory.mktemp("console") / "console.log"
    with running_console(
        database_url, redis_server.url, log, extra={"PLATFORM_CONSOLE_QUEUES": "mail,billing"}
    ) as started:
        yield started


@pytest.fixture
def database_url(console: Console, postgres_server: PostgresServer) -> str:
    """The console's database, its core tables emptied for this test."""
    return console_database(postgres_server)


def _token(session: requests.Session) -> str:
    return str(session.cookies["platform_console_csrftoken"])


def _post(
    console: Console,
    session: requests.Session,
    path: str,
    data: dict[str, str],
    *,
    token: bool = True,
) -> requests.Response:
    fields = {**data, **({"csrfmiddlewaretoken": _token(session)} if token else {})}
    return session.post(
        f"{console.url}{BASE}/{path}",
        data=fields,
        timeout=60,
        headers={"Referer": f"{console.url}/admin/"},
        allow_redirects=False,
    )


def _operations(database_url: str) -> list[tuple[str, str, str]]:
    return [
        (k, a, o)
        for k, a, o in query(
            database_url, "SELECT kind, actor, outcome FROM core.operations ORDER BY id"
        )
    ]


def test_an_action_without_the_csrf_token_is_refused(console: Console, database_url: str) -> None:
    insert_dead_letter(database_url, tenant="acme")
    operator = logged_in_session(console, *OPERATOR)
    reply = _post(console, operator, "deadletter/bulk/replay/", {"tenant_id": "acme"}, token=False)
    assert reply.status_code == 403
    assert "CSRF" in reply.text
    assert _operations(database_url) == []


def test_get_never_acts_even_with_every_field_of_the_form(
    console: Console, database_url: str
) -> None:
    insert_dead_letter(database_url, tenant="acme")
    operator = logged_in_session(console, *OPERATOR)
    for path, params in [
        ("deadletter/bulk/replay/", {"tenant_id": "acme"}),
        ("deadletter/bulk/discard/", {"tenant_id": "acme"}),
        ("queue/pause/", {"queue": "mail"}),
        ("queue/cancel/", {"tenant_id": "acme"}),
    ]:
        reply = operator.get(f"{console.url}{BASE}/{path}", params=params, timeout=30)
        assert reply.status_code == 200, path
        assert 'id="confirm"' in reply.text, path  # the operator is offered the button
    assert _operations(database_url) == []
    assert query(database_url, "SELECT status FROM core.dead_letters") == [("pending_review",)]


def test_bulk_discard_by_filter_is_logged_with_the_user_and_reason(
    console: Console, database_url: str
) -> None:
    spam = [insert_dead_letter(database_url, tenant="acme", kind="mail.send") for _ in range(4)]
    kept = insert_dead_letter(database_url, tenant="acme", kind="billing.charge")
    operator = logged_in_session(console, *OPERATOR)

    preview = operator.get(
        f"{console.url}{BASE}/deadletter/bulk/discard/",
        timeout=30,
        params={"tenant_id": "acme", "kind": "mail.send"},
    )
    assert re.search(r'id="preview-count">4<', preview.text)
    without_reason = _post(
        console, operator, "deadletter/bulk/discard/", {"tenant_id": "acme", "kind": "mail.send"}
    )
    assert without_reason.status_code == 302
    assert _operations(database_url) == []

    reply = _post(
        console,
        operator,
        "deadletter/bulk/discard/",
        {"tenant_id": "acme", "kind": "mail.send", "reason": "spam wave"},
    )
    assert reply.status_code == 302 and "/operation/" in reply.headers["Location"]
    assert _operations(database_url) == [("discard", OPERATOR[0], "succeeded")]
    rows = dict(query(database_url, "SELECT id, status FROM core.dead_letters"))
    assert {rows[i] for i in spam} == {"discarded"} and rows[kept] == "pending_review"
    reasons = query(
        database_url,
        "SELECT DISTINCT discard_reason FROM core.dead_letters WHERE status = 'discarded'",
    )
    assert len(reasons) == 1 and reasons[0][0].startswith("spam wave")


def test_a_searched_list_cannot_select_a_bulk_action(console: Console, database_url: str) -> None:
    insert_dead_letter(database_url, tenant="acme", error="TimeoutError: upstream")
    operator = logged_in_session(console, *OPERATOR)
    listed = operator.get(f"{console.url}{BASE}/deadletter/", params={"q": "upstream"}, timeout=30)
    assert listed.status_code == 200 and "bulk-replay" in listed.text
    page = operator.get(
        f"{console.url}{BASE}/deadletter/bulk/replay/", params={"q": "upstream"}, timeout=30
    )
    assert 'id="refusal"' in page.text and "search" in page.text
    assert 'id="confirm"' not in page.text


def test_pause_and_resume_from_the_queues_page(console: Console, database_url: str) -> None:
    operator = logged_in_session(console, *OPERATOR)
    page = operator.get(f"{console.url}{BASE}/queue/", timeout=30).text
    assert {"default", "mail", "billing"} <= set(re.findall(r'data-queue="([^"]+)"', page))

    assert _post(console, operator, "queue/pause/", {"queue": "mail"}).status_code == 302
    page = operator.get(f"{console.url}{BASE}/queue/", timeout=30).text
    row = re.search(r'data-queue="mail">(.*?)</tr>', page, re.S)
    assert row and f"paused by {OPERATOR[0]}" in row.group(1) and "Resume" in row.group(1)

    assert _post(console, operator, "queue/resume/", {"queue": "mail"}).status_code == 302
    page = operator.get(f"{console.url}{BASE}/queue/", timeout=30).text
    row = re.search(r'data-queue="mail">(.*?)</tr>', page, re.S)
    assert row and "paused by" not in row.group(1)
    assert _operations(database_url) == [
        ("pause", OPERATOR[0], "succeeded"),
        ("resume", OPERATOR[0], "succeeded"),
    ]


def test_cancel_by_tenant_from_the_console_is_logged_and_in_force(
    console: Console, database_url: str
) -> None:
    operator = logged_in_session(console, *OPERATOR)
    preview = operator.get(
        f"{console.url}{BASE}/queue/cancel/", params={"tenant_id": "gone"}, timeout=30
    )
    assert 'id="preview-delayed">0<' in preview.text
    reply = _post(console, operator, "queue/cancel/", {"tenant_id": "gone"})
    assert reply.status_code == 302 and "/operation/" in reply.headers["Location"]
    assert [row[:2] for row in _operations(database_url)] == [("cancel", OPERATOR[0])]
    page = operator.get(f"{console.url}{BASE}/queue/", timeout=30).text
    assert "tenant_id=gone" in page


def test_payload_data_needs_its_permission_and_stored_text_is_escaped(
    console: Console, database_url: str
) -> None:
    row = insert_dead_letter(
        database_url,
        tenant="acme",
        data={"card": "4111-1111"},
        error="Boom <img src=x onerror=alert(1)>",
    )
    viewer = logged_in_session(console, *VIEWER)
    operator = logged_in_session(console, *OPERATOR)
    seen_by_viewer = viewer.get(f"{console.url}{BASE}/deadletter/{row}/change/", timeout=30).text
    seen_by_operator = operator.get(
        f"{console.url}{BASE}/deadletter/{row}/change/", timeout=30
    ).text
    assert "4111-1111" not in seen_by_viewer and "view_dead_letter_payload" in seen_by_viewer
    assert "4111-1111" in seen_by_operator
    assert "<img src=x" not in seen_by_operator
    assert "&lt;img src=x onerror=alert(1)&gt;" in seen_by_operator
    assert "<img src=x" not in seen_by_viewer and "onerror" not in seen_by_viewer
    listed = operator.get(f"{console.url}{BASE}/deadletter/", timeout=30).text
    assert "<img src=x" not in listed and "&lt;img src=x onerror=alert(1)&gt;" in listed


def test_console_tables_live_in_schema_console_and_passwords_stay_secret(
    console: Console, database_url: str
) -> None:
    schemas = {
        s
        for (s,) in query(
            database_url,
            "SELECT DISTINCT schemaname FROM pg_tables "
            "WHERE tablename LIKE 'auth\\_%%' OR tablename LIKE 'django\\_%%'",
        )
    }
    assert schemas == {"console"}
    core = {
        t
        for (t,) in query(database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'core'")
    }
    assert not {t for t in core if t.startswith(("auth_", "django_"))}

    output = create_user(console.env, "another", "another-Pass-for-the-console-4", "viewer")
    assert "created console user another (viewer)" in output
    assert "event=console.user_saved" in output and "console user admin" in console.log()
    for secret in (ADMIN_PASSWORD, OPERATOR[1], VIEWER[1], "another-Pass-for-the-console-4"):
        assert secret not in console.log()
        assert secret not in output


def test_a_weak_password_is_refused_without_echoing_it(console: Console) -> None:
    import subprocess

    from tests.support.console import CLI

    done = subprocess.run(
        [CLI, "console", "create-user", "weak", "--role", "viewer"],
        env={**console.env, "PLATFORM_CONSOLE_PASSWORD": "hunter2"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "too short" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr


def test_a_user_without_view_permission_is_refused_every_page(console: Console) -> None:
    subprocess_env = {**console.env}
    create_user(subprocess_env, "nobody", "nobody-Pass-for-the-console-5", "viewer")
    from tests.support.console import query as run

    # take the viewer group away: staff without any console permission
    run(
        console.env["PLATFORM_DATABASE_URL"],
        "DELETE FROM console.auth_user_groups WHERE user_id = "
        "(SELECT id FROM console.auth_user WHERE username = 'nobody')",
    )
    session = logged_in_session(console, "nobody", "nobody-Pass-for-the-console-5")
    for path in (
        "deadletter/",
        "operation/",
        "queue/",
        "deadletter/bulk/replay/?tenant_id=a",
        "queue/pause/?queue=default",
        "queue/cancel/",
        "batch/",
        "batch/01a24f9a-5ff2-7bed-9573-db6446b0f0f6/",
    ):
        reply = session.get(f"{console.url}{BASE}/{path}", timeout=30, allow_redirects=False)
        assert reply.status_code == 403, (path, reply.status_code)


def test_it_listens_on_loopback_only_by_default(console: Console) -> None:
    import psutil

    listening = [
        c.laddr
        for c in psutil.Process(console.process.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(address.ip == "127.0.0.1" for address in listening)


def test_an_unmigrated_database_is_refused_naming_the_migrate_command(
    console: Console, postgres_server: PostgresServer
) -> None:
    import subprocess

    import psycopg2

    from tests.support.console import CLI

    conn = psycopg2.connect(postgres_server.admin_url())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS console_unmigrated WITH (FORCE)")
        cur.execute("CREATE DATABASE console_unmigrated")
    conn.close()
    url = postgres_server.url.rsplit("/", 1)[0] + "/console_unmigrated"
    done = subprocess.run(
        [CLI, "console", "--port", "1"],
        env={**console.env, "PLATFORM_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert "run 'platform-tasks migrate'" in done.stderr
    assert query(url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'console'") == [(0,)]


def test_the_date_filter_of_the_list_carries_into_the_bulk_replay(
    console: Console, database_url: str
) -> None:
    recent = insert_dead_letter(database_url, tenant="acme")
    old = insert_dead_letter(database_url, tenant="acme")
    query(
        database_url,
        "UPDATE core.dead_letters SET created_at = now() - interval '10 days' WHERE id = %s",
        old,
    )
    operator = logged_in_session(console, *OPERATOR)
    listed = operator.get(f"{console.url}{BASE}/deadletter/", timeout=30).text
    past_week = re.search(r'href="(\?created_at__gte=[^"]+)"[^>]*>\s*Past 7 days', listed)
    assert past_week, "the list offers the 'Past 7 days' date filter"
    query_string = past_week.group(1).replace("&amp;", "&")
    page = operator.get(f"{console.url}{BASE}/deadletter/bulk/replay/{query_string}", timeout=30)
    assert re.search(r'id="preview-count">1<', page.text), page.text[-2000:]
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text))
    fields.pop("csrfmiddlewaretoken")
    assert set(fields) == {"since", "until"}
    reply = _post(console, operator, "deadletter/bulk/replay/", fields)
    assert reply.status_code == 302
    statuses = dict(query(database_url, "SELECT id, status FROM core.dead_letters"))
    assert statuses == {recent: "replayed", old: "pending_review"}


def test_an_empty_filter_acts_only_when_every_row_is_meant(
    console: Console, database_url: str
) -> None:
    rows = [insert_dead_letter(database_url, tenant=t) for t in ("acme", "globex")]
    operator = logged_in_session(console, *OPERATOR)
    page = operator.get(f"{console.url}{BASE}/deadletter/bulk/discard/", timeout=30).text
    assert re.search(r'id="preview-count">2<', page) and 'name="everything"' in page
    unticked = _post(console, operator, "deadletter/bulk/discard/", {"reason": "all of it"})
    assert unticked.status_code == 302 and "/operation/" not in unticked.headers["Location"]
    assert _operations(database_url) == []
    ticked = _post(
        console, operator, "deadletter/bulk/discard/", {"reason": "all of it", "everything": "yes"}
    )
    assert "/operation/" in ticked.headers["Location"]
    assert query(
        database_url,
        "SELECT count(*) FROM core.dead_letters WHERE id = ANY(%s) AND status = 'discarded'",
        rows,
    ) == [(2,)]


def test_nothing_matching_offers_no_button(console: Console, database_url: str) -> None:
    operator = logged_in_session(console, *OPERATOR)
    page = operator.get(
        f"{console.url}{BASE}/deadletter/bulk/replay/", params={"tenant_id": "nobody"}, timeout=30
    ).text
    assert 'id="nothing-matches"' in page and 'id="confirm"' not in page


UNIQUE_VIOLATION = (
    "psycopg2.errors.UniqueViolation: duplicate key value violates unique constraint "
    '"users_email_key"\nDETAIL:  Key (email)=(alice@example.com) already exists.\n\n'
    "Traceback (most recent call last):\n"
    '  File "app/signup.py", line 12, in handle\n'
    "    cur.execute(INSERT_USER, (email,))\n"
    "psycopg2.errors.UniqueViolation: duplicate key value violates unique constraint "
    '"users_email_key"\nDETAIL:  Key (email)=(alice@example.com) already exists.'
)
CUSTOMER_DATA = ("alice@example.com", "bob@example.com", "carol@example.com", "4111-1111")


def test_a_viewer_sees_metadata_and_error_type_never_error_text_or_foreign_payloads(
    console: Console, database_url: str
) -> None:
    """Customer data hides in more than the envelope's ``data``: the error text (a unique
    violation's DETAIL quotes the value), a search over that text (an oracle: does any
    error mention alice?), and payloads that are not envelopes (Celery's ``args``, any
    other keys). A viewer sees the envelope's metadata and the error type only."""
    error_type = "psycopg2.errors.UniqueViolation"
    envelope = insert_dead_letter(
        database_url,
        tenant="acme",
        kind="users.signup",
        error=UNIQUE_VIOLATION,
        error_type=error_type,
        data={"card": "4111-1111"},
    )
    celery_args = insert_dead_letter(
        database_url,
        tenant="acme",
        error=UNIQUE_VIOLATION,
        error_type=error_type,
        payload={"args": ["bob@example.com"], "kwargs": {"plan": "pro"}},
    )
    foreign = insert_dead_letter(
        database_url,
        tenant="acme",
        error=UNIQUE_VIOLATION,
        error_type=error_type,
        payload={"kind": "crm.sync", "customer": {"email": "carol@example.com"}},
    )
    viewer = logged_in_session(console, *VIEWER)
    operator = logged_in_session(console, *OPERATOR)

    def pages(session: requests.Session) -> dict[str, str]:
        seen = {
            f"row {row}": session.get(
                f"{console.url}{BASE}/deadletter/{row}/change/", timeout=30
            ).text
            for row in (envelope, celery_args, foreign)
        }
        seen["list"] = session.get(f"{console.url}{BASE}/deadletter/", timeout=30).text
        seen["preview"] = session.get(
            f"{console.url}{BASE}/deadletter/bulk/replay/",
            params={"tenant_id": "acme"},
            timeout=30,
        ).text
        return seen

    for name, page in pages(viewer).items():
        for secret in CUSTOMER_DATA:
            assert secret not in page, f"the viewer's {name} page shows {secret}"
        assert error_type in page, f"the viewer's {name} page lacks the error type"
    envelope_page = viewer.get(f"{console.url}{BASE}/deadletter/{envelope}/change/", timeout=30)
    assert "corr-" in envelope_page.text and "users.signup" in envelope_page.text

    # the search does not look into the error text for a viewer ...
    searched = viewer.get(
        f"{console.url}{BASE}/deadletter/", params={"q": "alice@example.com"}, timeout=30
    ).text
    assert f"/deadletter/{envelope}/change/" not in searched
    by_kind = viewer.get(
        f"{console.url}{BASE}/deadletter/", params={"q": "users.signup"}, timeout=30
    ).text
    assert f"/deadletter/{envelope}/change/" in by_kind  # metadata is still searchable
    for lookup in ("last_error__icontains", "payload__icontains"):  # nor a URL lookup
        probed = viewer.get(
            f"{console.url}{BASE}/deadletter/", params={lookup: "alice"}, timeout=30
        )
        assert probed.status_code == 403, lookup
        assert f"/deadletter/{envelope}/change/" not in probed.text, lookup
    by_tenant = viewer.get(
        f"{console.url}{BASE}/deadletter/", params={"tenant_id__startswith": "ac"}, timeout=30
    )
    assert f"/deadletter/{envelope}/change/" in by_tenant.text  # metadata lookups stay

    # ... and the permission shows all of it
    operator_pages = pages(operator)
    assert "alice@example.com" in operator_pages[f"row {envelope}"]
    assert "bob@example.com" in operator_pages[f"row {celery_args}"]
    assert "carol@example.com" in operator_pages[f"row {foreign}"]
    assert "duplicate key value violates" in operator_pages["preview"]
    searched = operator.get(
        f"{console.url}{BASE}/deadletter/", params={"q": "alice@example.com"}, timeout=30
    ).text
    assert f"/deadletter/{envelope}/change/" in searched
    probed = operator.get(
        f"{console.url}{BASE}/deadletter/", params={"last_error__icontains": "alice"}, timeout=30
    )
    assert f"/deadletter/{envelope}/change/" in probed.text


def _login(
    console: Console, username: str, password: str, session: requests.Session | None = None
) -> requests.Response:
    """One POST of the admin's login form (a fresh session unless given, its CSRF token)."""
    session = session or requests.Session()
    session.get(f"{console.url}/admin/login/", timeout=10).raise_for_status()
    token = session.cookies["platform_console_csrftoken"]
    return session.post(
        f"{console.url}/admin/login/?next=/admin/",
        timeout=30,
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{console.url}/admin/login/"},
        allow_redirects=False,
    )


def test_failed_logins_lock_that_user_from_that_address_in_every_console_process(
    console: Console,
    postgres_server: PostgresServer,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """Five wrong passwords for one user from one address lock that pair out, even with
    the right password, for a bounded time; another user from the same address is not
    locked. The count lives in the console's database, so a second console process
    (several behind one proxy) refuses the locked pair too."""
    password = "tess-Pass-for-the-console-6"
    create_user(console.env, "tess", password, "viewer")
    logged_in = logged_in_session(console, *VIEWER)  # a session is no way around it
    for attempt in range(5):
        session = logged_in if attempt % 2 else None
        failed = _login(console, "tess", f"wrong-{attempt}", session)
        assert failed.status_code == 200, (attempt, failed.status_code)  # the form again
    locked = _login(console, "tess", password)
    assert locked.status_code == 429
    assert 0 < int(locked.headers["Retry-After"]) <= 15 * 60
    assert "Too many failed logins" in locked.text and password not in locked.text
    assert _login(console, *OPERATOR).status_code == 302  # another user, same address
    assert "event=console.login_locked" in console.log()
    assert password not in console.log() and "wrong-0" not in console.log()

    with running_console(
        console_database(postgres_server), redis_server.url, tmp_path / "second.log", users=False
    ) as second:
        assert _login(second, "tess", password).status_code == 429
