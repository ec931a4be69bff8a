"""The consumer-testing fixtures of the installed plugin, exercised by real pytest runs in
a temporary project that declares its consumer the way docs/consumers.md does
(``@app.task(base=PlatformTask, data_model=M)`` on ``def handler(envelope, tx)``) and
tests it with the fixtures of docs/testing.md: applied once, a duplicate, a dead letter
with its row, a retry scheduled, and a wait that times out. The example of docs/testing.md
runs verbatim too.

The first run lets the kit start its own Redis and PostgreSQL from binaries with
Celery's pytest plugins loaded (a user's default); the second names the suite's servers
through ``PLATFORM_TEST_REDIS_URL`` / ``PLATFORM_TEST_DATABASE_URL`` with ``-p no:celery``
(this project's own configuration) and binds an app factory with ``settings=``; its row
must land in the suite's database. A
third imports the app at the top of ``conftest.py``, before the servers exist: the kit
fails the test saying the app is not bound to them.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import psycopg2

from tests.conftest import REPO_ROOT
from tests.integration.testing.pytest_project import run_pytest

SHOP_APP = """
from pydantic import BaseModel

from platform_tasks import PermanentError, PlatformTask, create_app

app = create_app("shop_app")


class Order(BaseModel):
    order_id: int
    fail: str | None = None


@app.task(base=PlatformTask, data_model=Order, name="shop.record_order")
def record_order(envelope, tx):
    tx.execute("INSERT INTO orders (order_id, tenant_id) VALUES (%s, %s)",
               (envelope.data.order_id, envelope.tenant_id))
    if envelope.data.fail == "permanent" or envelope.data.order_id < 0:
        raise PermanentError("order cannot be recorded")
    if envelope.data.fail == "transient":
        raise ConnectionError("payment service unavailable")
"""

SCHEMA = """
import psycopg2


def create_tables(database_url):
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS orders (order_id int, tenant_id text)")
    conn.close()
"""

CONFTEST = """
import pytest

from shop.schema import create_tables


@pytest.fixture(scope="session")
def platform_celery_app(platform_environment, platform_database_url):
    create_tables(platform_database_url)
    from shop.celery_app import app  # imported here: create_app reads the test servers' settings
    return app


@pytest.fixture
def platform_truncate_tables():
    return ["orders"]
"""

ORDER_TESTS = """
from datetime import UTC, datetime

import pytest


def order(order_id, fail=None):
    return {"tenant_id": "acme", "kind": "shop.record_order",
            "data": {"order_id": order_id, "fail": fail}}


def orders(db):
    with db.cursor() as cur:
        cur.execute("SELECT order_id, tenant_id FROM orders ORDER BY order_id")
        return cur.fetchall()


def test_an_order_is_applied_once(platform_jobs, platform_db):
    job_id = platform_jobs.publish("default", order(7))
    outcome = platform_jobs.wait(job_id, timeout=30)
    assert (outcome.status, outcome.attempt, outcome.job_id) == ("applied", 1, job_id)
    assert outcome.processed_at is not None, "the idempotency row was committed"
    assert orders(platform_db) == [(7, "acme")]


def test_the_same_job_id_again_is_a_duplicate(platform_jobs, platform_db):
    job_id = platform_jobs.publish("default", order(8))
    assert platform_jobs.wait(job_id).status == "applied"
    platform_jobs.publish("default", {**order(8), "job_id": str(job_id)})
    again = platform_jobs.wait(job_id)
    assert (again.status, again.reason) == ("duplicate", "applied")
    assert orders(platform_db) == [(8, "acme")], "one row, and the previous test's is gone"


def test_a_permanent_error_is_dead_lettered_with_its_row(platform_jobs, platform_db):
    job_id = platform_jobs.publish("default", order(9, fail="permanent"))
    outcome = platform_jobs.wait(job_id)
    assert (outcome.status, outcome.reason) == ("dead_lettered", "permanent_error")
    row = outcome.dead_letter
    assert (row["job_id"], row["kind"], row["queue"], row["status"], row["attempts"]) == (
        job_id, "shop.record_order", "default", "pending_review", 1)
    assert row["payload"]["data"] == {"order_id": 9, "fail": "permanent"}
    assert "order cannot be recorded" in row["last_error"]
    assert orders(platform_db) == [], "the handler's insert was rolled back"


def test_a_failing_handler_gets_a_retry_scheduled(platform_jobs, platform_db):
    job_id = platform_jobs.publish("default", order(10, fail="transient"))
    outcome = platform_jobs.wait(job_id)
    assert (outcome.status, outcome.attempt, outcome.error_type) == (
        "retry_scheduled", 1, "ConnectionError")
    assert outcome.retry_at > datetime.now(UTC)
    assert orders(platform_db) == []
    with platform_db.cursor() as cur:
        cur.execute("SELECT count(*) FROM core.dead_letters")
        assert cur.fetchone() == (0,)


def test_only_the_committed_transaction_publishes(platform_jobs, platform_database_url):
    import psycopg2

    conn = psycopg2.connect(platform_database_url)
    rolled_back = platform_jobs.publish("default", order(12), tx=conn)
    [rolled_back_later] = platform_jobs.schedule_many(
        "default", [(order(13), datetime.now(UTC))], tx=conn)
    conn.rollback()
    committed = platform_jobs.publish("default", order(14), tx=conn)
    [committed_later] = platform_jobs.schedule_many(
        "default", [(order(15), datetime.now(UTC))], tx=conn)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM core.outbox")
        assert cur.fetchone() == (2,), "the jobs wait in the transaction, not the broker"
    conn.commit()
    conn.close()
    assert platform_jobs.wait(committed).status == "applied"
    assert platform_jobs.wait(committed_later).status == "applied"
    assert platform_jobs.outcomes(rolled_back) == []
    assert platform_jobs.outcomes(rolled_back_later) == []


def test_a_job_nobody_consumes_times_out(platform_jobs):
    job_id = platform_jobs.publish("nobody.listens", order(11))
    with pytest.raises(TimeoutError, match=str(job_id)):
        platform_jobs.wait(job_id, timeout=1)
"""

FACTORY = """
from platform_tasks import PlatformTask, create_app


def make_app(settings=None):
    app = create_app("shop_factory", settings=settings)

    @app.task(base=PlatformTask, name="shop.record_order")
    def record_order(envelope, tx):
        tx.execute("INSERT INTO orders (order_id, tenant_id) VALUES (%s, %s)",
                   (envelope.data["order_id"], envelope.tenant_id))

    return app
"""

FACTORY_CONFTEST = """
import pytest

from shop.factory import make_app
from shop.schema import create_tables


@pytest.fixture(scope="session")
def platform_celery_app(platform_settings, platform_database_url):
    create_tables(platform_database_url)
    return make_app(settings=platform_settings)


@pytest.fixture(scope="session")
def platform_worker_parameters():
    return {"hostname": "shop-tests@localhost"}
"""

SUPPLIED_SERVER_TESTS = """
def test_the_row_lands_in_the_supplied_database(platform_jobs, platform_database_url,
                                                platform_worker):
    import os

    assert platform_database_url == os.environ["PLATFORM_TEST_DATABASE_URL"]
    assert platform_worker.hostname == "shop-tests@localhost"
    job_id = platform_jobs.publish("default", {"tenant_id": "supplied",
                                               "kind": "shop.record_order",
                                               "data": {"order_id": 42}})
    assert platform_jobs.wait(job_id).status == "applied"
"""


def write_shop(root: Path, tests: str, conftest: str = CONFTEST) -> Path:
    """``root`` as a project: the ``shop`` package (app, consumer, schema), ``conftest.py``
    and ``test_orders.py``."""
    (root / "shop").mkdir()
    for name, source in {
        "shop/__init__.py": "",
        "shop/celery_app.py": SHOP_APP,
        "shop/schema.py": SCHEMA,
        "conftest.py": conftest,
        "test_orders.py": tests,
    }.items():
        (root / name).write_text(textwrap.dedent(source))
    return root


def documented_example() -> tuple[str, str]:
    """The consumer-testing block of docs/testing.md, verbatim: (conftest.py, test_orders.py)."""
    guide = (REPO_ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"```python\n(# conftest\.py\n.*?)```", guide, re.S)
    assert block, "the consumer-testing example of docs/testing.md is gone"
    conftest, marker, tests = block.group(1).partition("# test_orders.py\n")
    assert marker, "the docs/testing.md example names test_orders.py"
    return conftest, tests


def test_the_documented_example_passes_as_written(tmp_path: Path) -> None:
    conftest, tests = documented_example()
    outcome = run_pytest(write_shop(tmp_path, tests, conftest))
    assert (outcome.passed, outcome.failed, outcome.errors) == (2, 0, 0), outcome.output


def test_the_kit_runs_a_projects_consumer_tests_on_servers_it_starts(tmp_path: Path) -> None:
    outcome = run_pytest(write_shop(tmp_path, ORDER_TESTS))
    assert (outcome.passed, outcome.failed, outcome.errors) == (6, 0, 0), outcome.output
    assert "6 passed" in outcome.output.strip().splitlines()[-1]
    assert "delay promotion failed" not in outcome.output, "the worker's promoter stopped"


def test_the_kit_uses_the_servers_a_user_supplies(
    tmp_path: Path, redis_url: str, database_url: str
) -> None:
    """Servers named by the two variables, and the other way to bind an app: a factory
    called with ``settings=platform_settings`` (the app module is imported at the top of
    ``conftest.py``, which is fine for a factory)."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.orders")
    conn.close()
    project = write_shop(tmp_path, SUPPLIED_SERVER_TESTS, FACTORY_CONFTEST)
    (project / "shop" / "factory.py").write_text(textwrap.dedent(FACTORY))
    outcome = run_pytest(
        project,
        env={"PLATFORM_TEST_REDIS_URL": redis_url, "PLATFORM_TEST_DATABASE_URL": database_url},
        args=["-p", "no:celery"],
    )
    assert (outcome.passed, outcome.failed, outcome.errors) == (1, 0, 0), outcome.output
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT order_id, tenant_id FROM public.orders")
        assert cur.fetchall() == [(42, "supplied")]
        cur.execute("DROP TABLE public.orders")
    conn.close()


EARLY_IMPORT_CONFTEST = """
import pytest

from shop.celery_app import app  # built at collection, before the test servers exist


@pytest.fixture(scope="session")
def platform_celery_app():
    return app
"""


def test_an_app_built_before_the_test_servers_is_reported(tmp_path: Path) -> None:
    outcome = run_pytest(write_shop(tmp_path, SUPPLIED_SERVER_TESTS, EARLY_IMPORT_CONFTEST))
    assert (outcome.passed, outcome.errors) == (0, 1), outcome.output
    assert "platform_celery_app is not bound to the test servers" in outcome.output
    assert "PLATFORM_REDIS_URL, PLATFORM_DATABASE_URL differ" in outcome.output
