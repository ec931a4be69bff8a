"""``platform-tasks batches``: list batches and show one (counts, tenants, callbacks).

Both commands read :mod:`platform_tasks.batches.status`, the read model the console's
batch pages use too. ``show`` also says where the outstanding children are (waiting,
delayed, running, dead): it reads the delay store and asks the running workers
(``--no-where`` skips both). Exit codes: 0 done, 1 no such batch, 2 bad usage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
import psycopg2
from psycopg2.extensions import connection as Connection
from rich.console import Console
from rich.table import Table

from platform_tasks.batches import status
from platform_tasks.cli.common import NOTHING_MATCHED, cli_error, database_settings, load_app
from platform_tasks.cli.terminal_text import printable
from platform_tasks.settings import PlatformSettings, redact_url

__all__ = ["batches"]

OUTCOMES = ("applied", "dead_lettered", "discarded", "cancelled", "outstanding")


@contextmanager
def _connection(settings: PlatformSettings) -> Iterator[Connection]:
    try:
        conn = psycopg2.connect(
            settings.database_url, connect_timeout=10, application_name="platform-tasks cli"
        )
    except psycopg2.Error as exc:
        failure = cli_error(exc, settings)
        raise click.ClickException(
            f"cannot connect to PLATFORM_DATABASE_URL ({redact_url(settings.database_url or '')}):"
            f" {failure.message}"
        ) from None
    try:
        yield conn
    finally:
        conn.close()


def _console() -> Console:
    # Wide when piped, so a table in a log or a test is not folded at 80 columns.
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def _fired(summary: status.BatchSummary) -> str:
    parts = []
    for callback in summary.callbacks:
        if callback.is_set:
            when = _when(callback.fired_at) if callback.fired_at else "not yet"
            parts.append(f"{callback.name.removeprefix('on_')}: {when}")
    return ", ".join(parts) or "none set"


@click.group()
def batches() -> None:
    """Batches: groups of jobs with callbacks when they have ended."""


@batches.command("list")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@click.option("--open", "open_only", is_flag=True, help="Only batches with children outstanding.")
@click.option(
    "--before",
    type=click.DateTime(formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]),
    help="Only batches created before this time (UTC): the next page.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array for scripts.")
def list_command(limit: int, open_only: bool, before: datetime | None, as_json: bool) -> None:
    """List batches, newest first, with their children counted by outcome."""
    settings = database_settings()
    before_utc = before.replace(tzinfo=UTC) if before is not None else None
    try:
        with _connection(settings) as conn:
            rows = status.list_batches(conn, limit=limit, before=before_utc, open_only=open_only)
    except click.ClickException:
        raise
    except Exception as exc:
        raise cli_error(exc, settings) from None
    if as_json:
        _echo_json([row.to_json() for row in rows])
        return
    if not rows:
        click.echo("no batches")
        return
    table = Table(title="batches (newest first)", title_justify="left")
    for column in ("batch", "created", "state", "description", *OUTCOMES, "callbacks fired"):
        table.add_column(column)
    for row in rows:
        counts = row.counts.to_json()
        table.add_row(
            str(row.batch_id),
            _when(row.created_at),
            row.state,
            printable(row.description),
            *(str(counts[name]) for name in OUTCOMES),
            _fired(row),
        )
    _console().print(table)


@batches.command("show")
@click.argument("batch_id")
@click.option(
    "--where/--no-where",
    default=True,
    show_default=True,
    help="Look up where the outstanding children are (delay store, running workers).",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    help="The application whose workers are asked which jobs they run "
    "(default: one built from the PLATFORM_* settings).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the batch as JSON.")
def show_command(batch_id: str, where: bool, app_spec: str | None, as_json: bool) -> None:
    """Show one batch: counts by outcome and by tenant, callbacks, where its children are."""
    try:
        wanted = status.parse_batch_id(batch_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="BATCH_ID") from None
    settings = database_settings()
    locator = _locator(settings, app_spec) if where else None
    try:
        with _connection(settings) as conn:
            detail = status.show_batch(conn, wanted, locator=locator)
    except click.ClickException:
        raise
    except Exception as exc:
        raise cli_error(exc, settings) from None
    if detail is None:
        click.echo(f"batch {wanted} not found", err=True)
        sys.exit(NOTHING_MATCHED)
    if as_json:
        _echo_json(detail.to_json())
        return
    _print_detail(detail)


def _locator(settings: PlatformSettings, app_spec: str | None) -> status.ChildLocator:
    from platform_tasks.app import PLATFORM_APP_NAME, create_app
    from platform_tasks.batches.locator import WorkerAndDelayLocator

    app = load_app(app_spec) if app_spec else create_app(PLATFORM_APP_NAME, settings=settings)
    return WorkerAndDelayLocator(settings, app=app)


def _print_detail(detail: status.BatchDetail) -> None:
    summary = detail.summary
    console = _console()
    table = Table(show_header=False, title=f"batch {summary.batch_id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("description", printable(summary.description) or "-")
    table.add_row("profile", printable(summary.profile))
    table.add_row("state", summary.state)
    table.add_row("created", _when(summary.created_at))
    table.add_row("last progress", _when(summary.progressed_at))
    table.add_row("stall alerted", _when(summary.stall_alerted_at))
    for name, value in summary.counts.to_json().items():
        table.add_row(name, str(value))
    if detail.places is not None:
        table.add_row("children are", detail.places.describe())
    for callback in summary.callbacks:
        if callback.is_set:
            target = f"{printable(callback.kind or '')} on {printable(callback.queue or '')}"
            fired = f"fired {_when(callback.fired_at)}" if callback.fired_at else "not fired"
            table.add_row(callback.name, f"{target}: {fired}")
        else:
            table.add_row(callback.name, "not set")
    console.print(table)
    tenants = Table(
        title=f"by tenant ({len(detail.tenants)} of {detail.tenant_total})", title_justify="left"
    )
    tenants.add_column("tenant")
    for name in OUTCOMES:
        tenants.add_column(name)
    for row in detail.tenants:
        counts = row.counts.to_json()
        tenants.add_row(printable(row.tenant_id), *(str(counts[name]) for name in OUTCOMES))
    console.print(tenants)
