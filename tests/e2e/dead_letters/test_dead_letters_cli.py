"""``platform-tasks dead-letters`` end to end: the real console script against real servers.

Rows are written with the repository the consumer uses; every command runs as a subprocess
with the environment an operator would export, and replays are checked on the real broker
(the Redis list of the queue) or by a real worker consuming them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import redis

from platform_tasks.dead_letters.dead_letter import insert_dead_letter
from platform_tasks.dead_letters.store import get_dead_letter
from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until
from tests.support.operations import REPLAYED_HEADERS, STORED_HEADERS, replayed_headers
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

REPO_ROOT = Path(__file__).resolve().parents[3]
CLI = str(Path(sys.executable).parent / "platform-tasks")
APP = "tests.apps.basic_app:app"


def envelope(kind: str = "tests.record", tenant: str = "t1") -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": tenant,
        "correlation_id": uuid.uuid4().hex,
        "kind": kind,
        "data": {"n": 1},
    }


class Env:
    """The operator's shell: servers' URLs in ``PLATFORM_*`` and a way to run the CLI."""

    def __init__(self, redis_url: str, database_url: str) -> None:
        self.redis_url = redis_url
        self.database_url = database_url
        self.env = platform_env(redis_url=redis_url, database_url=database_url)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, "dead-letters", *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [CLI, "dead-letters", *args],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def add(self, payload: dict[str, Any] | None = None, **overrides: Any) -> int:
        payload = payload or envelope()
        values: dict[str, Any] = {
            "job_id": uuid.UUID(payload["job_id"]) if "job_id" in payload else None,
            "queue": "default",
            "kind": payload.get("kind"),
            "tenant_id": payload.get("tenant_id"),
            "payload": payload,
            "attempts": 5,
            "last_error": "RuntimeError: boom\nTraceback (most recent call last): ...",
            "error_type": "RuntimeError",
            "reason": "retries_exhausted",
            "correlation_id": payload.get("correlation_id"),
        }
        values.update(overrides)
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                return insert_dead_letter(cur, **values)
        finally:
            conn.close()

    def add_many(self, count: int, queue: str = "default") -> list[int]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                ids = []
                for _ in range(count):
                    payload = envelope()
                    ids.append(
                        insert_dead_letter(
                            cur,
                            job_id=uuid.UUID(payload["job_id"]),
                            queue=queue,
                            kind=payload["kind"],
                            tenant_id="t1",
                            payload=payload,
                            attempts=5,
                            last_error="boom",
                            error_type="RuntimeError",
                            reason="retries_exhausted",
                            correlation_id=payload["correlation_id"],
                        )
                    )
                return ids
        finally:
            conn.close()

    def row(self, row_id: int) -> Any:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn.cursor() as cur:
                return get_dead_letter(cur, row_id)
        finally:
            conn.close()


def broker_job_ids(client: redis.Redis, queue: str) -> list[str]:
    """Task ids (``headers.id``) of the messages waiting in the queue's Redis list."""
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]


def broker_bodies(client: redis.Redis, queue: str) -> list[Any]:
    import base64

    bodies = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body).decode()
        bodies.append(json.loads(body))
    return bodies


@pytest.fixture
def cli(redis_url: str, database_url: str) -> Env:
    return Env(redis_url, database_url)


def test_list_empty_exits_zero(cli: Env) -> None:
    result = cli.run("list")
    assert result.returncode == 0, result.stderr
    assert "no dead letters" in result.stdout
    as_json = cli.run("list", "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == []


def test_list_table_json_and_filters(cli: Env) -> None:
    a = cli.add(envelope(kind="billing.charge", tenant="acme"), queue="billing")
    b = cli.add(envelope(kind="mail.send", tenant="other"), queue="mail")
    table = cli.run("list")
    assert table.returncode == 0, table.stderr
    assert "dead letters (2)" in table.stdout
    assert "billing.charge" in table.stdout and "mail.send" in table.stdout
    assert "RuntimeError" in table.stdout

    rows = json.loads(cli.run("list", "--json").stdout)
    assert [r["id"] for r in rows] == [b, a]
    assert rows[1]["payload"]["kind"] == "billing.charge"

    def ids(*args: str) -> list[int]:
        result = cli.run("list", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [r["id"] for r in json.loads(result.stdout)]

    assert ids("--queue", "billing") == [a]
    assert ids("--kind", "mail.send") == [b]
    assert ids("--tenant", "acme") == [a]
    assert ids("--status", "pending_review") == [b, a]
    assert ids("--status", "discarded") == []
    assert ids("--since", "1h") == [b, a]
    assert ids("--since", "2999-01-01T00:00:00") == []
    assert ids("--queue", "billing", "--tenant", "other") == []

    bad = cli.run("list", "--since", "yesterday-ish")
    assert bad.returncode == 2
    assert "--since" in bad.stderr


def test_show_found_and_not_found(cli: Env) -> None:
    payload = envelope(kind="billing.charge", tenant="acme")
    row_id = cli.add(payload, queue="billing")
    shown = cli.run("show", str(row_id))
    assert shown.returncode == 0, shown.stderr
    assert payload["job_id"] in shown.stdout
    assert "Traceback" in shown.stdout
    as_json = json.loads(cli.run("show", str(row_id), "--json").stdout)
    assert as_json["payload"] == payload and as_json["status"] == "pending_review"

    missing = cli.run("show", "987654")
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    assert cli.run("show", "not-a-number").returncode == 2


def test_replay_by_id_publishes_same_job_id_to_original_queue(
    cli: Env, redis_client: redis.Redis
) -> None:
    payload = envelope()
    row_id = cli.add(payload, queue="billing")
    other = cli.add(queue="billing")
    result = cli.run("replay", str(row_id), "--app", APP)
    assert result.returncode == 0, result.stderr
    assert f"replayed {row_id}" in result.stdout
    assert broker_job_ids(redis_client, "billing") == [payload["job_id"]]
    args, _kwargs, _embed = broker_bodies(redis_client, "billing")[0]
    assert args == [payload]
    row = cli.row(row_id)
    assert (row.status, row.replay_count) == ("replayed", 1)
    assert row.replayed_at is not None
    assert cli.row(other).status == "pending_review"

    again = cli.run("replay", str(row_id), "--app", APP)
    assert again.returncode == 1
    assert "skipped" in again.stderr and "replayed" in again.stderr
    assert len(broker_job_ids(redis_client, "billing")) == 1


def test_replay_by_filters_and_dry_run(cli: Env, redis_client: redis.Redis) -> None:
    acme = [cli.add(envelope(tenant="acme"), queue="q1") for _ in range(3)]
    other = cli.add(envelope(tenant="other"), queue="q1")

    dry = cli.run("replay", "--tenant", "acme", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [r["id"] for r in json.loads(dry.stdout)["replayed"]] == acme
    assert redis_client.llen("q1") == 0
    assert {cli.row(i).status for i in acme} == {"pending_review"}

    result = cli.run("replay", "--tenant", "acme", "--queue", "q1", "--app", APP, "--json")
    assert result.returncode == 0, result.stderr
    replayed = json.loads(result.stdout)["replayed"]
    assert [r["id"] for r in replayed] == acme
    assert sorted(broker_job_ids(redis_client, "q1")) == sorted(r["job_id"] for r in replayed)
    assert cli.row(other).status == "pending_review"

    nothing = cli.run("replay", "--tenant", "nobody", "--app", APP)
    assert nothing.returncode == 1


def test_replay_by_filter_sends_the_stored_headers_as_a_replay_by_id_does(
    cli: Env, redis_client: redis.Redis
) -> None:
    """The row's trace context and custom headers go out with it whichever way it is
    selected; its stored publish time and a name Celery uses do not."""
    by_id = cli.add(envelope(tenant="by-id"), queue="by_id", headers=STORED_HEADERS)
    cli.add(envelope(tenant="acme"), queue="by_filter", headers=STORED_HEADERS)
    assert cli.run("replay", str(by_id)).returncode == 0
    by_filter = cli.run("replay", "--tenant", "acme")
    assert by_filter.returncode == 0, by_filter.stderr
    assert replayed_headers(redis_client, "by_id") == REPLAYED_HEADERS
    assert replayed_headers(redis_client, "by_filter") == REPLAYED_HEADERS


def test_replay_usage_errors(cli: Env) -> None:
    cli.add()
    no_selection = cli.run("replay", "--app", APP)
    assert no_selection.returncode == 2
    assert "--all" in no_selection.stderr
    assert cli.run("replay", "--all", "1", "--app", APP).returncode == 2
    assert cli.run("replay", "--all", "--app", "no_such_module:app").returncode == 2
    assert cli.run("replay", "--all", "--app", "platform_tasks:__all__").returncode == 2


def test_replay_all_refuses_raw_poison_rows(cli: Env, redis_client: redis.Redis) -> None:
    raw = {"raw": "not json {", "content_type": "application/json", "headers": {}}
    poison = cli.add(raw, job_id=None, kind=None, tenant_id=None, reason="poison")
    refused = cli.run("replay", "--all", "--app", APP)
    assert refused.returncode == 1
    assert f"refused {poison}" in refused.stderr
    assert "not a readable envelope" in refused.stderr
    assert cli.row(poison).status == "pending_review"

    good = cli.add(queue="default")
    result = cli.run("replay", "--all", "--app", APP)
    assert result.returncode == 0, result.stderr
    assert f"replayed {good}" in result.stdout
    assert broker_job_ids(redis_client, "default") == [str(cli.row(good).job_id)]


def test_replayed_job_is_consumed_by_a_real_worker(
    cli: Env, redis_client: redis.Redis, tmp_path: Path
) -> None:
    payload = envelope()
    row_id = cli.add(payload, queue="default")
    cli.env["PLATFORM_APP"] = "no_such_module:app"  # the app comes from PLATFORM_APP
    wrong = cli.run("replay", str(row_id))
    assert wrong.returncode == 2
    assert "no_such_module" in wrong.stderr
    cli.env["PLATFORM_APP"] = APP
    result = cli.run("replay", str(row_id))
    assert result.returncode == 0, result.stderr
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv(APP, concurrency=1, pool="solo"),
            env=cli.env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        wait_until(
            lambda: redis_client.llen("test:recorded") >= 1,
            timeout=60,
            message="the replayed job to run",
        )
    recorded = [json.loads(item) for item in redis_client.lrange("test:recorded", 0, -1)]
    assert recorded == [payload]


def test_discard_requires_reason_and_reports_matches(cli: Env) -> None:
    a, b = cli.add(), cli.add()
    missing_reason = cli.run("discard", str(a))
    assert missing_reason.returncode == 2
    assert "--reason" in missing_reason.stderr
    assert cli.run("discard", "--reason", "x").returncode == 2
    assert cli.run("discard", str(a), "--reason", " ").returncode == 2

    done = cli.run("discard", str(a), "--reason", "customer left")
    assert done.returncode == 0, done.stderr
    row = cli.row(a)
    assert (row.status, row.discard_reason) == ("discarded", "customer left")
    assert row.discarded_at is not None
    assert cli.row(b).status == "pending_review"

    again = cli.run("discard", str(a), "424242", "--reason", "again")
    assert again.returncode == 1
    assert "not found" in again.stderr
    assert cli.run("replay", str(a), "--app", APP).returncode == 1


def test_concurrent_replays_publish_each_row_once(
    cli: Env, redis_client: redis.Redis, database_url: str
) -> None:
    ids = cli.add_many(200, queue="race")
    # Hold both replays at their first lock until both are waiting, then let them race.
    gate = psycopg2.connect(database_url)
    try:
        with gate.cursor() as cur:
            cur.execute("LOCK TABLE core.dead_letters IN EXCLUSIVE MODE")
            procs = [
                cli.popen("replay", "--all", "--batch-size", "10", "--app", APP, "--json")
                for _ in range(2)
            ]

            def both_waiting() -> bool:
                cur.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted "
                    "AND relation = 'core.dead_letters'::regclass"
                )
                return bool(cur.fetchone()[0] == 2)

            wait_until(both_waiting, timeout=60, message="both replays to wait on the table")
        gate.commit()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        gate.close()
    reports = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode in (0, 1), err
        reports.append(json.loads(out))
    counts = Counter(broker_job_ids(redis_client, "race"))
    assert len(counts) == 200
    assert set(counts.values()) == {1}
    by_process = [{r["id"] for r in report["replayed"]} for report in reports]
    assert by_process[0].isdisjoint(by_process[1])
    assert by_process[0] | by_process[1] == set(ids)
    print(f"rows replayed per process: {[len(s) for s in by_process]}")


@pytest.mark.parametrize(
    ("command", "url", "code", "says"),
    [
        (
            ("dead-letters", "list"),
            "postgresql://ops:{pw}@127.0.0.1:{free}/platform",
            1,
            "cannot connect to PLATFORM_DATABASE_URL (postgresql://ops:***@127.0.0.1",
        ),
        (
            ("dead-letters", "show", "1"),
            "postgresql://ops:{pw}@127.0.0.1:5x/platform",
            2,
            "PLATFORM_DATABASE_URL: Value error, postgresql://ops:***@127.0.0.1:5x",
        ),
        (
            ("dead-letters", "list"),
            "postgresql://ops:{pw}@[::1/platform",
            2,
            "ops:***@[::1/platform",
        ),
        (
            ("migrate",),
            "postgresql://ops:{pw}@127.0.0.1:{free}/platform",
            1,
            "PLATFORM_DATABASE_URL",
        ),
        (
            ("maintenance", "purge-processed-jobs"),
            "postgresql://ops:{pw}@127.0.0.1:{free}/p",
            1,
            "Connection refused",
        ),
    ],
)
def test_database_errors_never_print_the_password(
    redis_url: str, command: tuple[str, ...], url: str, code: int, says: str
) -> None:
    from platform_tasks.testing.servers import free_port

    password = "Op5-pa55word"
    env = platform_env(redis_url=redis_url, database_url=url.format(pw=password, free=free_port()))
    result = subprocess.run(
        [CLI, *command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert says in output
    assert password not in output


def _run_in(cli: Env, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "dead-letters", *args],
        cwd=cwd,
        env={**cli.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _reference_publish(cli: Env, queue: str, payload: dict[str, Any]) -> None:
    """What the application itself sends for this envelope: ``QueuePort(app).publish``."""
    code = (
        "import json, sys\n"
        "from platform_tasks import QueuePort\n"
        "from tests.apps.basic_app import app\n"
        "port = QueuePort(app)\n"
        "port.publish(sys.argv[1], json.loads(sys.argv[2]))\n"
        "port.close()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, queue, json.dumps(payload)],
        cwd=REPO_ROOT,
        env=cli.env,
        check=True,
        timeout=60,
    )


def _comparable(raw: bytes) -> dict[str, Any]:
    """A broker message without what differs between any two publishes of one envelope."""
    message = json.loads(raw)
    message["properties"].pop("delivery_tag")
    message["properties"].pop("reply_to")  # the publishing app instance's reply queue
    message["headers"].pop("origin")  # the publishing process: gen<pid>@host
    message["headers"].pop("platform_published_at")  # the moment of each publish
    message["headers"].pop("platform_publish_time")  # likewise, on the reference clock
    return dict(message)


def test_replay_needs_no_application_and_sends_what_the_app_would(
    cli: Env, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Run from an empty folder (an ops box): no --app, no PLATFORM_APP, no celery_app.py."""
    ops_box = tmp_path / "ops-box"
    ops_box.mkdir()
    payload = envelope()
    row_id = cli.add(payload, queue="default")
    result = _run_in(cli, ops_box, "replay", str(row_id))
    assert result.returncode == 0, result.stderr
    assert f"replayed {row_id}: job {payload['job_id']} to queue default" in result.stdout
    assert cli.row(row_id).status == "replayed"
    [replayed] = redis_client.lrange("default", 0, -1)
    message = json.loads(replayed)
    assert message["content-type"] == "application/json"
    headers = message["headers"]
    assert (headers["task"], headers["id"]) == (payload["kind"], payload["job_id"])
    assert headers["platform_attempt"] == 1
    assert "'n'" not in headers["argsrepr"] and payload["job_id"] in headers["argsrepr"]
    args, kwargs, _embed = broker_bodies(redis_client, "default")[0]
    assert (args, kwargs) == ([payload], {})

    _reference_publish(cli, "default", payload)
    reference = redis_client.lpop("default")  # LPUSHed: the head of the list
    assert reference is not None
    assert _comparable(replayed) == _comparable(reference)

    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv(APP, concurrency=1, pool="solo"),
            env=cli.env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        wait_until(
            lambda: redis_client.llen("test:recorded") >= 1,
            timeout=60,
            message="the replayed job to run",
        )
    recorded = [json.loads(item) for item in redis_client.lrange("test:recorded", 0, -1)]
    assert recorded == [payload]


def test_replay_exit_codes_outside_the_application_folder(
    cli: Env, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Unknown ids exit 1 before any application is imported or the broker is reached."""
    from platform_tasks.testing.servers import free_port

    marker = tmp_path / "imported"
    (tmp_path / "marker_app.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nfrom tests.apps.basic_app import app\n"
    )
    no_broker = {"PLATFORM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    unknown = _run_in(cli, tmp_path, "replay", "987654321", **no_broker)
    assert unknown.returncode == 1, unknown.stderr
    assert "skipped 987654321: not found" in unknown.stderr
    with_app = _run_in(cli, tmp_path, "replay", "987654321", "--app", "marker_app:app", **no_broker)
    assert with_app.returncode == 1, with_app.stderr
    assert not marker.exists(), "the application was imported for a replay of nothing"

    assert _run_in(cli, tmp_path, "replay").returncode == 2
    assert _run_in(cli, tmp_path, "replay", "--all", "--kind", "a.b").returncode == 2

    row_id = cli.add(queue="default")
    unreachable = _run_in(cli, tmp_path, "replay", str(row_id), **no_broker)
    assert unreachable.returncode == 1
    assert f"publishing dead letter {row_id} failed" in unreachable.stderr
    assert cli.row(row_id).status == "pending_review"
    done = _run_in(cli, tmp_path, "replay", str(row_id))
    assert done.returncode == 0, done.stderr
    assert broker_job_ids(redis_client, "default") == [str(cli.row(row_id).job_id)]


def test_replay_holds_the_envelope_to_the_current_size_limit(cli: Env, tmp_path: Path) -> None:
    payload = envelope()
    payload["data"] = {"blob": "x" * 4000}
    row_id = cli.add(payload, queue="default")
    refused = _run_in(cli, tmp_path, "replay", str(row_id), PLATFORM_MAX_PAYLOAD_BYTES="2048")
    assert refused.returncode == 1
    assert f"refused {row_id}" in refused.stderr and "exceeds 2048" in refused.stderr
    assert cli.row(row_id).status == "pending_review"


def test_list_and_show_print_stored_markup_literally(cli: Env) -> None:
    """Kinds and tenants are producer data: console markup in them is text, not a command."""
    kind, tenant = "a.b[/]", "[link=http://x]t[/link]"
    payload = envelope()
    payload["kind"], payload["tenant_id"] = kind, tenant
    row_id = cli.add(payload, kind=kind, tenant_id=tenant, error_type="[bold]Err[/bold]")
    listed = cli.run("list")
    assert listed.returncode == 0, listed.stderr
    assert kind in listed.stdout and tenant in listed.stdout
    assert "[bold]Err[/bold]" in listed.stdout
    assert "\x1b]8;" not in listed.stdout  # no terminal hyperlink was rendered
    shown = cli.run("show", str(row_id))
    assert shown.returncode == 0, shown.stderr
    assert kind in shown.stdout and tenant in shown.stdout
