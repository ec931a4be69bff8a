"""The operations console in a real browser (headless Chromium driven by selenium), against
``platform-tasks console`` started as docs/console.md starts it, on the harness PostgreSQL.

An operator logs in, filters the dead letters by tenant, opens one (its payload shown,
escaped), runs a bulk replay of the filter through its confirmation page and finds the
operation in the log, then lists the batches and opens one (counts by outcome and by
tenant, callbacks fired and when, where its outstanding children are); a read-only user
sees no action button anywhere and a POST forged with that user's valid session and CSRF
token is refused with 403, acting on nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from platform_tasks.testing.servers import PostgresServer, RedisServer
from tests.support.batch_rows import Child, insert_batch
from tests.support.console import (
    OPERATOR,
    VIEWER,
    Console,
    console_database,
    headless_chromium,
    insert_dead_letter,
    query,
    running_console,
)

SCRIPT = "<script>window.injected = true</script>"


def _log_in(web: Any, console: Console, username: str, password: str) -> None:
    web.get(f"{console.url}/admin/login/")
    web.find_element(By.ID, "id_username").send_keys(username)
    web.find_element(By.ID, "id_password").send_keys(password)
    web.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(web, 30).until(expected_conditions.url_to_be(f"{console.url}/admin/"))


def _column(web: Any, field: str) -> list[str]:
    return [
        cell.text for cell in web.find_elements(By.CSS_SELECTOR, f"#result_list td.field-{field}")
    ]


def _field(web: Any, name: str) -> str:
    return str(web.find_element(By.CSS_SELECTOR, f".field-{name} .readonly").text)


def _batches(database_url: str) -> UUID:
    """A finished batch and an open one (3 tenants, a callback fired); the open one's id."""
    done = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    insert_batch(
        database_url, [Child("acme", "applied", done)], description="done", created_at=done
    )
    ended = datetime(2026, 3, 2, 9, 5, tzinfo=UTC)
    return insert_batch(
        database_url,
        [
            Child("acme", "applied", ended),
            Child("acme", "dead_lettered", ended),
            Child("globex", "cancelled", ended),
            Child("globex"),
            Child("initech"),
        ],
        description=f"March invoices {SCRIPT}",
        created_at=datetime(2026, 3, 2, 9, 0, tzinfo=UTC),
        on_complete={"queue": "reports", "kind": "invoices.done", "tenant_id": "ops", "data": {}},
        on_death={"queue": "reports", "kind": "invoices.failed", "tenant_id": "ops", "data": {}},
        death_fired_at=ended,
    )


def _batch_pages(web: Any, console: Console, batch_id: UUID) -> None:
    web.find_element(By.LINK_TEXT, "Home").click()
    web.find_element(By.LINK_TEXT, "Batches").click()
    rows = web.find_elements(By.CSS_SELECTOR, "#batches tr.batch-row")
    assert [r.get_attribute("data-batch") for r in rows][1:] != [str(batch_id)]
    assert rows[0].get_attribute("data-batch") == str(batch_id)  # newest first
    assert len(rows) == 2
    cells = [c.text for c in rows[0].find_elements(By.CSS_SELECTOR, "td.count")]
    assert cells == ["1", "1", "0", "1", "2"]  # applied … outstanding
    assert rows[0].find_element(By.CSS_SELECTOR, "td.state").text == "open"
    assert (
        "on_death: 2026-03-02 09:05:00" in rows[0].find_element(By.CSS_SELECTOR, ".callbacks").text
    )
    web.find_element(By.ID, "show-open").click()
    WebDriverWait(web, 30).until(lambda w: "open=1" in w.current_url)
    assert len(web.find_elements(By.CSS_SELECTOR, "#batches tr.batch-row")) == 1

    web.find_element(By.LINK_TEXT, str(batch_id)).click()
    assert web.find_element(By.ID, "batch-description").text == f"March invoices {SCRIPT}"
    assert web.execute_script("return window.injected === undefined")
    counts = [c.text for c in web.find_elements(By.CSS_SELECTOR, "#batch-counts td.count")]
    assert counts == ["1", "1", "0", "1", "2", "5"]
    fired = {
        row.get_attribute("data-callback"): row.find_element(By.CSS_SELECTOR, ".fired").text
        for row in web.find_elements(By.CSS_SELECTOR, "#callbacks tbody tr")
    }
    assert fired == {"on_complete": "not yet", "on_success": "-", "on_death": "2026-03-02 09:05:00"}
    tenants = {
        row.get_attribute("data-tenant"): [
            c.text for c in row.find_elements(By.CSS_SELECTOR, "td.count")
        ]
        for row in web.find_elements(By.CSS_SELECTOR, "#tenants tr.tenant-row")
    }
    assert tenants == {
        "acme": ["1", "1", "0", "0", "0"],
        "globex": ["0", "0", "0", "1", "1"],
        "initech": ["0", "0", "0", "0", "1"],
    }
    web.find_element(By.ID, "where-link").click()
    WebDriverWait(web, 30).until(lambda w: "where=1" in w.current_url)
    assert web.find_element(By.ID, "places").text == (
        "Outstanding children: 2 waiting, 0 delayed, 0 running, 0 dead "
        "(could not look in: workers (none answered))"
    )
    web.get(f"{console.url}/admin/platform_console/batch/{uuid4()}/")
    assert "Not Found" in web.page_source or "404" in web.title


def test_operator_filters_opens_and_bulk_replays_with_confirmation(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    database_url = console_database(postgres_server)
    acme = [
        insert_dead_letter(database_url, tenant="acme", data={"card": SCRIPT}) for _ in range(3)
    ]
    others = [insert_dead_letter(database_url, tenant="globex") for _ in range(2)]
    batch_id = _batches(database_url)

    with (
        running_console(database_url, redis_server.url, tmp_path / "console.log") as console,
        headless_chromium(tmp_path) as web,
    ):
        try:
            _log_in(web, console, *OPERATOR)
            web.find_element(By.LINK_TEXT, "Dead letters").click()
            assert len(_column(web, "tenant_id")) == 5

            # filter by tenant from the sidebar
            web.find_element(
                By.CSS_SELECTOR, "#changelist-filter a[href*='tenant_id=acme']"
            ).click()
            WebDriverWait(web, 30).until(lambda w: "tenant_id=acme" in w.current_url)
            assert _column(web, "tenant_id") == ["acme"] * 3

            # open one: the full error and the payload, whose data is text, not markup
            web.find_element(By.CSS_SELECTOR, f"#result_list a[href*='/{acme[0]}/change/']").click()
            payload = web.find_element(By.CSS_SELECTOR, "pre.platform-payload").text
            assert SCRIPT in payload
            assert web.execute_script("return window.injected === undefined")
            assert _field(web, "error_full") == "ValueError: card declined"
            web.back()

            # the bulk replay of the current filter: preview, then confirm
            web.find_element(By.ID, "bulk-replay").click()
            assert web.find_element(By.ID, "preview-count").text == "3"
            assert "tenant_id=acme" in web.find_element(By.ID, "preview-filter").text
            sample = web.find_elements(By.CSS_SELECTOR, "#preview-sample tbody tr")
            assert len(sample) == 3
            # nothing happened on the way here (GET only)
            assert query(database_url, "SELECT count(*) FROM core.operations") == [(0,)]
            web.find_element(By.ID, "confirm").click()

            WebDriverWait(web, 60).until(lambda w: "/operation/" in w.current_url)
            assert _field(web, "kind") == "replay"
            assert _field(web, "actor") == OPERATOR[0]
            assert _field(web, "outcome") == "succeeded"
            assert _field(web, "matched") == "3"
            assert _field(web, "done") == "3"

            # and the log lists it
            web.find_element(By.LINK_TEXT, "Operations").click()
            rows = web.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
            assert len(rows) == 1
            assert _column(web, "actor") == [OPERATOR[0]]
            assert _column(web, "kind") == ["replay"]

            _batch_pages(web, console, batch_id)
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- console log ---\n{console.log()[-4000:]}") from exc

    statuses = dict(query(database_url, "SELECT id, status FROM core.dead_letters"))
    assert {statuses[i] for i in acme} == {"replayed"}
    assert {statuses[i] for i in others} == {"pending_review"}
    assert query(database_url, "SELECT kind, actor, done FROM core.operations") == [
        ("replay", OPERATOR[0], 3)
    ]


def test_viewer_sees_no_action_and_a_forged_post_is_refused(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    database_url = console_database(postgres_server)
    row = insert_dead_letter(
        database_url,
        tenant="acme",
        data={"secret": "4242-4242"},
        error="IntegrityError: duplicate key\nDETAIL:  Key (email)=(dora@example.com) exists.",
        error_type="IntegrityError",
    )

    with (
        running_console(database_url, redis_server.url, tmp_path / "console.log") as console,
        headless_chromium(tmp_path) as web,
    ):
        _log_in(web, console, *VIEWER)
        web.get(f"{console.url}/admin/platform_console/deadletter/")
        assert _column(web, "tenant_id") == ["acme"]
        assert not web.find_elements(By.ID, "bulk-replay")
        assert not web.find_elements(By.ID, "bulk-discard")
        assert _column(web, "error_type") == ["IntegrityError"]
        assert "dora@example.com" not in web.find_element(By.ID, "result_list").text
        # the search box looks in metadata only: the error text is no oracle
        box = web.find_element(By.ID, "searchbar")
        box.send_keys("dora@example.com")
        box.submit()
        WebDriverWait(web, 30).until(lambda w: "q=dora" in w.current_url)
        assert _column(web, "tenant_id") == []

        web.get(f"{console.url}/admin/platform_console/deadletter/{row}/change/")
        payload = web.find_element(By.CSS_SELECTOR, "pre.platform-payload").text
        assert "4242-4242" not in payload and "view_dead_letter_payload" in payload
        assert _field(web, "error_type") == "IntegrityError"
        assert not web.find_elements(By.CSS_SELECTOR, "pre.platform-error")
        assert "dora@example.com" not in web.find_element(By.ID, "content").text
        assert not web.find_elements(By.CSS_SELECTOR, "input[type=submit]")

        web.get(f"{console.url}/admin/platform_console/deadletter/bulk/replay/?tenant_id=acme")
        assert web.find_element(By.ID, "preview-count").text == "1"  # may look
        assert not web.find_elements(By.ID, "confirm")
        assert web.find_elements(By.ID, "no-permission")

        web.get(f"{console.url}/admin/platform_console/batch/")  # viewers may look
        assert web.find_elements(By.CSS_SELECTOR, "table#batches")

        web.get(f"{console.url}/admin/platform_console/queue/")
        assert web.find_elements(By.CSS_SELECTOR, "tr.queue-row")
        assert not web.find_elements(By.PARTIAL_LINK_TEXT, "Pause")
        assert not web.find_elements(By.ID, "cancel-jobs")

        # a POST forged with the viewer's own browser session and CSRF token
        cookies = {c["name"]: c["value"] for c in web.get_cookies()}
        assert "platform_console_session" in cookies
        token = cookies["platform_console_csrftoken"]
        referer = {"Referer": f"{console.url}/admin/"}
        forged = [
            ("deadletter/bulk/replay/", {"tenant_id": "acme"}),
            ("deadletter/bulk/discard/", {"tenant_id": "acme", "reason": "forged"}),
            ("queue/pause/", {"queue": "default"}),
            ("queue/cancel/", {"tenant_id": "acme"}),
        ]
        for path, data in forged:
            reply = requests.post(
                f"{console.url}/admin/platform_console/{path}",
                timeout=30,
                cookies=cookies,
                headers=referer,
                data={**data, "csrfmiddlewaretoken": token},
                allow_redirects=False,
            )
            assert reply.status_code == 403, (path, reply.status_code, console.log()[-3000:])

    assert query(database_url, "SELECT status FROM core.dead_letters") == [("pending_review",)]
    assert query(database_url, "SELECT count(*) FROM core.operations") == [(0,)]
