"""The JSON document of a static run, in the shape the product contract fixes."""

from __future__ import annotations

import json
from typing import Any

from platform_tasks.jobdocs.evidence import FIELD_NAMES, JobEvidence, Report

__all__ = ["render_json", "report_to_dict"]


def _job(job: JobEvidence) -> dict[str, Any]:
    return {
        "file": job.file,
        "path_label": job.path_label,
        "fields": {
            name: {"state": job.fields[name].state.value, "value": job.fields[name].value}
            for name in FIELD_NAMES
        },
        "evidence": "complete" if job.complete else "missing",
        "reasons": job.reasons,
    }


def report_to_dict(report: Report) -> dict[str, Any]:
    """The contract's document; ``runtime_verified`` is false whatever the evidence says."""
    return {
        "runtime_verified": False,
        "project": {"state": report.project.state.value, "reasons": report.project.reasons},
        "jobs": [_job(job) for job in report.jobs],
        "files_without_evidence": [
            {"file": item.file, "reasons": item.reasons} for item in report.files_without_evidence
        ],
    }


def render_json(report: Report) -> str:
    return json.dumps(report_to_dict(report), indent=2, ensure_ascii=False) + "\n"
