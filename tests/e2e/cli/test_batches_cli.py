"""``platform-tasks batches list|show`` end to end: the real console script against real
PostgreSQL and Redis (no worker runs, so ``show`` says it could not ask any)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support.batch_rows import Child, insert_batch
from tests.support.processes import platform_env

REPO_ROOT = Path(__file__).resolve().parents[3]
CLI = str(Path(sys.executable).parent / "platform-tasks")
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "batches", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_list_and_show_a_batch_as_json_and_as_tables(redis_url: str, database_url: str) -> None:
    ended = T0 + timedelta(minutes=2)
    batch_id = insert_batch(
        database_url,
        [Child("acme", "applied", ended), Child("acme", "dead_lettered", ended), Child("globex")],
        description="nightly export",
        created_at=T0,
        on_complete={"queue": "reports", "kind": "export.done", "tenant_id": "ops", "data": {}},
        on_death={"queue": "reports", "kind": "export.failed", "tenant_id": "ops", "data": {}},
        death_fired_at=ended,
    )
    env = platform_env(redis_url=redis_url, database_url=database_url)

    listed = run(env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["batch_id"] == str(batch_id)
    assert row["state"] == "open"
    assert row["counts"] == {
        "applied": 1,
        "dead_lettered": 1,
        "discarded": 0,
        "cancelled": 0,
        "outstanding": 1,
        "total": 3,
    }
    table = run(env, "list")
    assert table.returncode == 0, table.stderr
    assert str(batch_id) in table.stdout
    assert "nightly export" in table.stdout
    assert f"death: {ended:%Y-%m-%d %H:%M:%S}" in table.stdout
    assert "complete: not yet" in table.stdout

    shown = run(env, "show", str(batch_id), "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["description"] == "nightly export"
    assert [t["tenant_id"] for t in detail["tenants"]] == ["acme", "globex"]
    assert detail["tenants"][1]["outstanding"] == 1
    assert {c["name"]: c["fired_at"] for c in detail["callbacks"]} == {
        "on_complete": None,
        "on_success": None,
        "on_death": ended.isoformat(),
    }
    assert detail["places"] == {
        "waiting": 1,
        "delayed": 0,
        "running": 0,
        "dead": 0,
        "unknown": ["workers (none answered)"],
        "unlocated": 0,
    }
    text = run(env, "show", str(batch_id), "--no-where")
    assert text.returncode == 0, text.stderr
    assert "export.done on reports: not fired" in text.stdout
    assert "children are" not in text.stdout

    missing = run(env, "show", str(uuid.uuid4()))
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    bad = run(env, "show", "nope")
    assert bad.returncode == 2
    assert "'nope' is not a batch id" in bad.stderr
