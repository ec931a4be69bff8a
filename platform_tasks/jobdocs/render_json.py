"""The JSON document of a static run, in the shape the product contract fixes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from platform_tasks.jobdocs.evidence import (
    FIELD_NAMES,
    FieldEvidence,
    JobEvidence,
    JsonValue,
    Report,
)

__all__ = ["json_job_renderer", "render_json", "report_to_dict"]


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
        if report.prerendered is not None and report.prerendered[0] == "json":
            texts = report.prerendered[1]
        else:
            texts = list(map(json_job_renderer(), report.jobs))
        out.append("[\n    ")
        out.append(",\n    ".join(texts))
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
_FIELD_SEPARATOR = "," + _FIELD_INDENT


def json_job_renderer() -> Callable[[JobEvidence], str]:
    """A function writing one entry of ``jobs``, with its own cache of field texts keyed
    by evidence object: a tree shares a handful of them across thousands of jobs. The
    cache holds each object it has seen, so an id cannot be reused for another while the
    cache lives (jobs may be freed once written)."""
    fields: dict[tuple[str, int], tuple[FieldEvidence, str]] = {}
    return lambda job: _job_text(job, fields)


def _job_text(job: JobEvidence, fields: dict[tuple[str, int], tuple[FieldEvidence, str]]) -> str:
    texts = []
    for name in FIELD_NAMES:
        evidence = job.fields[name]
        key = (name, id(evidence))
        cached = fields.get(key)
        if cached is None:
            text = _field_text(name, evidence.state.value, evidence.value)
            fields[key] = (evidence, text)
        else:
            text = cached[1]
        texts.append(text)
    reasons = job.reasons
    if reasons:
        out: list[str] = []
        _write(reasons, _JOB_INDENT, out)
        reasons_text = "".join(out)
    else:
        reasons_text = "[]"
    file, label = _encode_str(job.file), _encode_str(job.path_label)
    completeness = '"complete"' if job.complete else '"missing"'
    # One entry of ``jobs`` exactly as :func:`_write` lays out :func:`_job`'s dictionary
    # at that depth.
    return (
        f'{{\n      "file": {file},\n      "path_label": {label},\n      "fields": {{\n        '
        f"{_FIELD_SEPARATOR.join(texts)}\n      }},\n      "
        f'"evidence": {completeness},\n      "reasons": {reasons_text}\n    }}'
    )


_STRING_FIELD = (
    "{name}: {{"
    + _FIELD_INDENT
    + '  "state": "{state}",'
    + _FIELD_INDENT
    + '  "value": {value}'
    + _FIELD_INDENT
    + "}}"
)


def _field_text(name: str, state: str, value: JsonValue) -> str:
    if isinstance(value, str):  # the common case, and each default name is seen once
        return _STRING_FIELD.format(name=_encode_str(name), state=state, value=_encode_str(value))
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
