"""The Markdown page of a static run, written for reviewers reading it in a pull request.

Defaults are labelled as defaults and unknown values as unknown, so the page never reads
more certain than the evidence behind it.
"""

from __future__ import annotations

from collections.abc import Callable

from platform_tasks.jobdocs.evidence import (
    FieldEvidence,
    FieldState,
    JobEvidence,
    JsonValue,
    Report,
)

__all__ = ["markdown_job_renderer", "render_markdown"]

_NOT_RUNTIME = (
    "> Static evidence only (`runtime_verified: false`): read from source files; no job "
    "module was imported or run. Declarations are not proof of start-up, connectivity "
    "or execution."
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _duration(seconds: int | float) -> str:
    if isinstance(seconds, int) or float(seconds).is_integer():
        total = int(seconds)
        for unit, size in (("h", 3600), ("m", 60)):
            if total >= size and total % size == 0:
                return f"{total // size}{unit}"
        return f"{total}s"
    return f"{seconds}s"


def _text(name: str, value: JsonValue) -> str:
    if value is None:
        return "the period, capped at 1h" if name == "lease_ttl" else "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name in ("interval", "lease_ttl") and isinstance(value, int | float):
        return _duration(value)
    return f"`{value}`"


def _show(name: str, field: FieldEvidence) -> str:
    """One cell: unknown stays unknown, a default says it is one."""
    if field.state is FieldState.UNKNOWN:
        return "*unknown*"
    text = _text(name, field.value)
    has_default = field.value is not None or name == "lease_ttl"
    if field.state is FieldState.ABSENT and has_default:
        return f"{text} (default)"
    return text


def _schedule(job: JobEvidence) -> str:
    cron, interval = job.fields["cron"], job.fields["interval"]
    parts = []
    if cron.state is not FieldState.ABSENT:
        parts.append(f"cron {_show('cron', cron)}")
    if interval.state is not FieldState.ABSENT:
        parts.append(f"every {_show('interval', interval)}")
    return " + ".join(parts) if parts else "*none*"


def _job_row(job: JobEvidence) -> str:
    cells = [
        _show("name", job.fields["name"]),
        f"`{job.path_label}`",
        _schedule(job),
        _show("timezone", job.fields["timezone"]),
        _show("enabled", job.fields["enabled"]),
        _show("lease_ttl", job.fields["lease_ttl"]),
        _show("queue", job.fields["queue"]),
        f"`{job.file}`",
        "complete" if job.complete else "**missing**",
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def markdown_job_renderer() -> Callable[[JobEvidence], str]:
    """A function writing one job's table row."""
    return _job_row


def render_markdown(report: Report) -> str:
    """The page: project state, one table row per definition, then every reason."""
    lines = [
        "# Scheduled jobs",
        "",
        _NOT_RUNTIME,
        "",
        f"Profile: `{report.profile}`",
        "",
        f"## Project state: `{report.project.state.value}`",
        "",
        *(f"- {reason}" for reason in report.project.reasons),
        "",
        "## Jobs",
        "",
    ]
    if report.jobs:
        lines += [
            "| Name | Path label | Schedule | Timezone | Enabled | Lease TTL | Queue | File "
            "| Evidence |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                report.prerendered[1]
                if report.prerendered is not None and report.prerendered[0] == "markdown"
                else map(_job_row, report.jobs)
            ),
        ]
    else:
        lines.append("No definitions found.")
    with_reasons = [job for job in report.jobs if job.reasons]
    if with_reasons:
        lines += ["", "## Reasons", ""]
        for job in with_reasons:
            lines += [f"### `{job.file}` (line {job.line})", ""]
            lines += [f"- {_cell(reason)}" for reason in job.reasons]
            lines.append("")
    if report.files_without_evidence:
        lines += ["", "## Files without evidence", "", "| File | Reasons |", "|---|---|"]
        for item in report.files_without_evidence:
            lines.append(f"| `{item.file}` | {_cell('; '.join(item.reasons))} |")
    return "\n".join(lines).rstrip("\n") + "\n"
