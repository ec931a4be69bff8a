"""``platform-tasks queues``, ``platform-tasks operations`` and ``platform-tasks jobs cancel``.

Operator actions over many jobs at once, each logged in ``core.operations`` with who ran
it (``--actor``, default the OS user). Exit codes as elsewhere: 0 done, 1 nothing matched
or the action failed, 2 bad usage.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from platform_tasks.cli.common import cli_error, database_settings
from platform_tasks.cli.terminal_text import printable
from platform_tasks.operations.cancel import (
    DEFAULT_RULE_TTL,
    cancel_jobs,
    cancel_rules,
    lift_cancel,
    preview_cancel,
)
from platform_tasks.operations.filters import JobFilter
from platform_tasks.operations.log import KINDS, Operation, list_operations
from platform_tasks.operations.pause import pause_queue, queue_overview, resume_queue
from platform_tasks.settings import PlatformSettings

NOTHING_MATCHED = 1
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _actor_option(func: Any) -> Any:
    return click.option(
        "--actor",
        envvar="PLATFORM_ACTOR",
        default=None,
        help="Who runs the operation (logged); default: the OS user.",
    )(func)


def _duration(value: str) -> timedelta:
    text = value.strip()
    if len(text) >= 2 and text[:-1].isdigit() and text[-1] in _DURATION_UNITS:
        seconds = int(text[:-1]) * _DURATION_UNITS[text[-1]]
        if seconds > 0:
            return timedelta(seconds=seconds)
    raise click.BadParameter(f"{value!r} is not a duration like 30m, 6h, 1d", param_hint="--keep")


def _fail(exc: Exception, settings: Any) -> click.ClickException:
    if isinstance(exc, ValueError):
        return click.UsageError(str(exc))
    return cli_error(exc, settings)


# -- queues --------------------------------------------------------------------------


@click.group("queues")
def queues() -> None:
    """Pause, resume and list queues across every worker."""


@queues.command("pause")
@click.argument("queue")
@_actor_option
def pause_command(queue: str, actor: str | None) -> None:
    """Stop every worker taking messages of QUEUE (within a second); jobs already taken
    finish. Lasts until `queues resume`, across worker restarts."""
    settings = database_settings()
    try:
        operation = pause_queue(settings, queue, actor=actor)
    except Exception as exc:
        raise _fail(exc, settings) from None
    note = " (it already was)" if operation.done == 0 else ""
    click.echo(f"paused {printable(queue)}{note}: operation {operation.id}")


@queues.command("resume")
@click.argument("queue")
@_actor_option
def resume_command(queue: str, actor: str | None) -> None:
    """Let workers take messages of QUEUE again. Exits 1 when it was not paused."""
    settings = database_settings()
    try:
        operation = resume_queue(settings, queue, actor=actor)
    except Exception as exc:
        raise _fail(exc, settings) from None
    if operation.done == 0:
        click.echo(f"{printable(queue)} was not paused (operation {operation.id})", err=True)
        sys.exit(NOTHING_MATCHED)
    click.echo(f"resumed {printable(queue)}: operation {operation.id}")


@queues.command("list")
@click.argument("names", metavar="[QUEUE]...", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def list_queues_command(names: tuple[str, ...], as_json: bool) -> None:
    """Depth (from the broker) and pause of QUEUEs; default: every paused queue and
    `default`."""
    settings = database_settings()
    try:
        statuses = queue_overview(settings, list(names) or None)
    except Exception as exc:
        raise _fail(exc, settings) from None
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "queue": s.queue,
                        "depth": s.depth,
                        "paused": s.paused is not None,
                        "paused_by": s.paused.actor if s.paused else None,
                        "paused_since": s.paused.since.isoformat() if s.paused else None,
                        "operation_id": s.paused.operation_id if s.paused else None,
                    }
                    for s in statuses
                ],
                indent=2,
            )
        )
        return
    table = Table(title="queues", title_justify="left")
    for name in ("queue", "depth", "paused", "by", "since", "operation"):
        table.add_column(name, justify="right" if name in ("depth", "operation") else "left")
    for s in statuses:
        table.add_row(
            printable(s.queue),
            "?" if s.depth is None else str(s.depth),
            "paused" if s.paused else "",
            printable(s.paused.actor) if s.paused else "",
            _when(s.paused.since) if s.paused else "",
            str(s.paused.operation_id) if s.paused else "",
        )
    _console().print(table)


# -- operations ----------------------------------------------------------------------


@click.group("operations")
def operations() -> None:
    """The log of operator actions (core.operations)."""


@operations.command("list")
@click.option("--kind", type=click.Choice(KINDS), help="Only operations of this kind.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def list_operations_command(kind: str | None, limit: int, as_json: bool) -> None:
    """Operations, newest first: who, when, what filter, how many, outcome."""
    settings = database_settings()
    try:
        rows = list_operations(settings, limit=limit, kind=kind)
    except Exception as exc:
        raise _fail(exc, settings) from None
    if as_json:
        click.echo(json.dumps([row.to_json() for row in rows], indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no operations")
        return
    _console().print(_operations_table(rows))


def _operations_table(rows: list[Operation]) -> Table:
    table = Table(title=f"operations ({len(rows)})", title_justify="left")
    for name in (
        "id",
        "kind",
        "actor",
        "started",
        "finished",
        "filter",
        "matched",
        "done",
        "failed",
        "outcome",
        "detail",
    ):
        table.add_column(
            name, justify="right" if name in ("id", "matched", "done", "failed") else "left"
        )
    for row in rows:
        shown = " ".join(f"{k}={v}" for k, v in row.filter.items() if v is not None)
        table.add_row(
            str(row.id),
            row.kind,
            printable(row.actor),
            _when(row.started_at),
            _when(row.finished_at),
            printable(shown),
            str(row.matched),
            str(row.done),
            str(row.failed),
            row.outcome,
            printable(row.detail or ""),
        )
    return table


# -- jobs cancel ---------------------------------------------------------------------


@click.command("cancel")
@click.option("--tenant", "tenant_id", help="Cancel this tenant's waiting jobs.")
@click.option("--kind", help="Cancel waiting jobs of this kind (task name).")
@click.option("--queue", help="Cancel waiting jobs of this queue.")
@click.option(
    "--keep",
    "keep",
    default=None,
    metavar="DURATION",
    help="How long consumers keep cancelling matching queued jobs as they come up "
    "(30m, 6h, 1d; default 1d).",
)
@click.option("--dry-run", is_flag=True, help="Count matching delayed jobs; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--lift",
    "lift",
    type=int,
    default=None,
    metavar="OPERATION",
    help="End the cancel rule of this operation early instead.",
)
@click.option("--rules", "show_rules", is_flag=True, help="List the cancel rules in force.")
@click.option(
    "--app",
    "app_spec",
    envvar="PLATFORM_APP",
    default=None,
    show_envvar=True,
    help="The application (module:attr, imported like celery -A) whose broker options "
    "(a global_keyprefix) the delay-store sweep must know to match --queue.",
)
@_actor_option
def cancel_command(
    tenant_id: str | None,
    kind: str | None,
    queue: str | None,
    keep: str | None,
    dry_run: bool,
    yes: bool,
    lift: int | None,
    show_rules: bool,
    app_spec: str | None,
    actor: str | None,
) -> None:
    """Cancel waiting jobs by tenant, kind and/or queue: delayed jobs (and retries
    waiting) are removed now, queued jobs are not run when a worker takes them; each one
    gets a dead-letter row (status discarded, 'cancelled by operation N'). Jobs published
    after the cancel run normally. A running job sees is_cancelled() turn true."""
    settings = database_settings()
    if show_rules or lift is not None:
        _rules(settings, show=show_rules, lift=lift)
        return
    try:
        where = JobFilter(tenant_id=tenant_id, kind=kind, queue=queue)
    except ValueError:
        raise click.UsageError("give at least one of --tenant, --kind, --queue") from None
    ttl = _duration(keep) if keep else DEFAULT_RULE_TTL
    app = None
    if app_spec:
        from platform_tasks.cli.common import load_app

        app = load_app(app_spec)
    if dry_run or (not yes and sys.stdin.isatty()):
        _show_preview(settings, where, app)
        if dry_run:
            return
        if not click.confirm("cancel them?", default=False):
            raise click.Abort()
    try:
        result = cancel_jobs(settings, where, actor=actor, rule_ttl=ttl, app=app)
    except Exception as exc:
        raise _fail(exc, settings) from None
    click.echo(
        f"operation {result.operation.id}: cancelled {result.delayed_cancelled} delayed "
        f"job(s); queued jobs matching {printable(where.describe())} published up to now "
        f"are cancelled as workers take them, until {_when(result.rule.expires_at)}"
    )


def _rules(settings: PlatformSettings, *, show: bool, lift: int | None) -> None:
    """``--rules`` lists the cancel rules in force; ``--lift N`` ends one (exit 1: none)."""
    if show:
        for rule in cancel_rules(settings):
            click.echo(
                f"operation {rule.operation_id}: {printable(rule.filter.describe())} "
                f"published up to {_when(rule.cutoff)}, until {_when(rule.expires_at)}"
            )
    if lift is not None and not lift_cancel(settings, lift):
        click.echo(f"no cancel rule of operation {lift} is in force", err=True)
        sys.exit(NOTHING_MATCHED)
    if lift is not None:
        click.echo(f"lifted the cancel rule of operation {lift}")


def _show_preview(settings: PlatformSettings, where: JobFilter, app: Any) -> None:
    """What a cancel would take: the delayed jobs now, the queued ones as workers take them."""
    preview = preview_cancel(settings, where, app=app)
    depths = ", ".join(f"{q}: {'?' if d is None else d}" for q, d in preview.queue_depths.items())
    click.echo(
        f"{preview.delayed} delayed job(s) match {printable(where.describe())}"
        + (
            f"; queued ({printable(depths)}) are checked as workers take them"
            if depths
            else "; queued jobs are checked as workers take them"
        )
    )
