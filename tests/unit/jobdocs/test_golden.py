"""Every fixture project renders exactly its reviewed golden JSON."""

from __future__ import annotations

import json

import pytest

from platform_tasks.jobdocs import render_json
from tests.unit.jobdocs.conftest import CASES, GOLDEN, report_for


def test_every_case_has_a_golden_file() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == CASES


@pytest.mark.parametrize("case", CASES)
def test_json_matches_golden(case: str) -> None:
    rendered = render_json(report_for(case))

    assert rendered == (GOLDEN / f"{case}.json").read_text()


@pytest.mark.parametrize("case", CASES)
def test_json_shape_follows_the_contract(case: str) -> None:
    document = json.loads(render_json(report_for(case)))

    assert list(document) == ["runtime_verified", "project", "jobs", "files_without_evidence"]
    assert document["runtime_verified"] is False
    assert set(document["project"]) == {"state", "reasons"}
    for job in document["jobs"]:
        assert list(job) == ["file", "path_label", "fields", "evidence", "reasons"]
        assert list(job["fields"]) == [
            "name",
            "cron",
            "interval",
            "timezone",
            "enabled",
            "lease_ttl",
            "queue",
        ]
        assert all(set(f) == {"state", "value"} for f in job["fields"].values())
        assert {f["state"] for f in job["fields"].values()} <= {"known", "absent", "unknown"}
        assert job["evidence"] in ("complete", "missing")
    for item in document["files_without_evidence"]:
        assert list(item) == ["file", "reasons"]
        assert item["reasons"]
