"""platform-tasks jobs show and jobs list --correlation-id: where job instances are.

Answered by :mod:`platform_tasks.jobs_status`.

``jobs list`` without ``--correlation-id`` is the listing of scheduled job *definitions*
it always was (now ``platform-tasks schedules list``), kept for this release with a
notice on stderr naming the new command.
"""

from __future__ import annotations

import json
from typing import Any

import click

from platform_tasks.cli.common import cli_error, database_settings, load_app
from platform_tasks.cli.schedules import notice
from platform_tasks.cli.terminal_text import printable

__all__ = ["list_command", "show"]

_app_option = click.option(
    "--app",
    "app_spec",
    envvar="PLATFORM_APP",
    default=None,
    show_envvar=True,
    help="The application (module:attr, imported like celery -A) whose queues and broker "
    "options are searched; without it: default, PLATFORM_CONSOLE_QUEUES, paused and fair "
    "queues.",
)
_queue_option = click.option(
    "--queue",
    "queues",
    multiple=True,
    help="Also search this queue (repeatable).",
)


def _source(app_spec: str | None) -> Any:
    settings = database_settings()
    if app_spec:
        app = load_app(app_spec)
        return app, app.platform_settings
    return settings, settings


@click.command("show")
@click.argument("job_id")
@_app_option
@_queue_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(job_id: str, app_spec: str | None, queues: tuple[str, ...], as_json: bool) -> None:
    """Where one job is: waiting, delayed, running, applied, dead_lettered, cancelled or
    unknown, with the details of that state (and its recorded output)."""
    from platform_tasks.jobs_status import StatusReader

    source, settings = _source(app_spec)
    try:
        with StatusReader(source, queues=queues) as reader:
            status = reader.job(job_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="JOB_ID") from None
    except Exception as exc:
        raise cli_error(exc, settings) from None
    if as_json:
        click.echo(json.dumps(status.to_json(), indent=2, default=str))
        return
    click.echo(f"job {status.job_id}: {status.state}")
    if status.correlation_id:
        click.echo(f"  correlation_id: {printable(status.correlation_id)}")
    for line in _lines(status.details, "  "):
        click.echo(line)
    if status.output is not None:
        click.echo("  output:")
        for consumer, value in status.output.items():
            click.echo(f"    {printable(consumer)}: {printable(json.dumps(value))}")


def _lines(details: dict[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for key, value in details.items():
        if value is None or value == "":
            continue
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(_lines(value, indent + "  "))
        elif isinstance(value, list):
            shown = ", ".join(
                " ".join(str(v) for v in item.values()) if isinstance(item, dict) else str(item)
                for item in value
            )
            lines.append(f"{indent}{key}: {printable(shown)}")
        else:
            lines.append(f"{indent}{key}: {printable(str(value))}")
    return lines


def _correlation(
    correlation_id: str, app_spec: str | None, queues: tuple[str, ...], as_json: bool
) -> None:
    from platform_tasks.jobs_status import StatusReader

    source, settings = _source(app_spec)
    try:
        with StatusReader(source, queues=queues) as reader:
            statuses = reader.correlation(correlation_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--correlation-id") from None
    except Exception as exc:
        raise cli_error(exc, settings) from None
    if as_json:
        rows = [status.to_json() for status in statuses]
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not statuses:
        click.echo(f"no job of correlation id {printable(correlation_id)} found", err=True)
        raise SystemExit(1)
    for status in statuses:
        click.echo(f"{status.job_id}  {status.state:<13}  {printable(status.summary())}")
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status.state] = counts.get(status.state, 0) + 1
    click.echo(
        f"{len(statuses)} job(s): " + ", ".join(f"{n} {state}" for state, n in counts.items())
    )


@click.command("list")
@click.option(
    "--correlation-id",
    default=None,
    help="List the jobs of one request (correlation id) with their states, in publish "
    "order where known.",
)
@_app_option
@_queue_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (with --correlation-id).")
@click.option("--profile", default=None, help="(scheduled jobs: see `schedules list`)")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default=None, hidden=True)
@click.pass_context
def list_command(
    ctx: click.Context,
    correlation_id: str | None,
    app_spec: str | None,
    queues: tuple[str, ...],
    as_json: bool,
    profile: str | None,
    fmt: str | None,
) -> None:
    """List the jobs of one request: --correlation-id ID. (Without it: the scheduled job
    definitions, now `platform-tasks schedules list`.)"""
    if correlation_id is not None:
        _correlation(correlation_id, app_spec, queues, as_json)
        return
    from platform_tasks.cli.jobs_runtime import list_jobs

    notice("jobs list", "schedules list")
    ctx.invoke(list_jobs, profile=profile, fmt="json" if as_json else (fmt or "table"))
