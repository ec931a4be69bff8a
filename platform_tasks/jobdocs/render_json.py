"""The JSON document of a static run, in the shape the product contract fixes."""

from __future__ import annotations

import json
import math
from typing import Any

from platform_tasks.jobdocs.evidence import FIELD_NAMES, JobEvidence, JsonValue, Report

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
    """The document as ``json.dumps(..., indent=2, ensure_ascii=False)`` writes it, byte for
    byte, built with the C string encoder: the standard library falls back to its pure
    Python encoder whenever ``indent`` is set, which dominates large reports.

    Jobs, the bulk of a large report, are written without building their dictionaries,
    and each distinct field rendering is produced once (a tree repeats a handful of
    states and defaults thousands of times)."""
    out: list[str] = ['{\n  "runtime_verified": false,\n  "project": ']
    project = {"state": report.project.state.value, "reasons": report.project.reasons}
    _write(project, "\n  ", out)
    out.append(',\n  "jobs": ')
    if report.jobs:
        separator = "[\n    "
        fields: dict[tuple[str, str, type, JsonValue], str] = {}
        for job in report.jobs:
            out.append(separator)
            _write_job(job, out, fields)
            separator = ",\n    "
        out.append("\n  ]")
    else:
        out.append("[]")
    out.append(',\n  "files_without_evidence": ')
    without = [
        {"file": item.file, "reasons": item.reasons} for item in report.files_without_evidence
    ]
    _write(without, "\n  ", out)
    out.append("\n}\n")
    return "".join(out)


_JOB_INDENT = "\n      "
_FIELD_INDENT = "\n        "


def _write_job(
    job: JobEvidence, out: list[str], fields: dict[tuple[str, str, type, JsonValue], str]
) -> None:
    """One entry of ``jobs`` exactly as :func:`_write` lays out :func:`_job`'s dictionary
    at that depth."""
    out.append("{" + _JOB_INDENT + '"file": ')
    out.append(_encode_str(job.file))
    out.append("," + _JOB_INDENT + '"path_label": ')
    out.append(_encode_str(job.path_label))
    out.append("," + _JOB_INDENT + '"fields": {')
    separator = _FIELD_INDENT
    for name in FIELD_NAMES:
        evidence = job.fields[name]
        state, value = evidence.state.value, evidence.value
        if isinstance(value, float):  # 0.0 == -0.0 but they render differently
            text = _field_text(name, state, value)
        else:
            # The type is part of the key: True and 1 are equal but render differently.
            key = (name, state, type(value), value)
            cached = fields.get(key)
            if cached is None:
                cached = fields[key] = _field_text(name, state, value)
            text = cached
        out.append(separator)
        out.append(text)
        separator = "," + _FIELD_INDENT
    out.append("\n      }," + _JOB_INDENT + '"evidence": ')
    out.append('"complete"' if job.complete else '"missing"')
    out.append("," + _JOB_INDENT + '"reasons": ')
    _write(job.reasons, _JOB_INDENT, out)
    out.append("\n    }")


def _field_text(name: str, state: str, value: JsonValue) -> str:
    out = [_encode_str(name), ": "]
    _write({"state": state, "value": value}, _FIELD_INDENT, out)
    return "".join(out)


_encode_str: Any = json.encoder.encode_basestring  # the C version when available


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _write(value: Any, newline: str, out: list[str]) -> None:
    """Append ``value`` in ``indent=2`` layout; ``newline`` is ``"\n"`` plus the current
    indentation."""
    if isinstance(value, str):
        out.append(_encode_str(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = newline + "  "
        separator = "{" + inner
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
            out.append(separator)
            out.append(_encode_str(key))
            out.append(": ")
            _write(item, inner, out)
            separator = "," + inner
        out.append(newline + "}")
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner = newline + "  "
        separator = "[" + inner
        for item in value:
            out.append(separator)
            _write(item, inner, out)
            separator = "," + inner
        out.append(newline + "]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
