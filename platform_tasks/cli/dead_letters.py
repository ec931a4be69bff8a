"""``platform-tasks dead-letters``: list, show, replay and discard dead-lettered jobs.

Exit codes are the same for every command so scripts can rely on them: 0 done, 1 nothing
matched (or a replay publish failed), 2 bad usage. ``list`` exits 0 even when empty.
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
from rich.text import Text

from platform_tasks.cli.common import (
    NOTHING_MATCHED,
    cli_error,
    database_settings,
    exit_if_nothing,
    load_app,
)
from platform_tasks.cli.dead_letter_selection import (
    BulkOptions,
    bulk_options,
    filter_options,
    require_selection,
    selection,
)
from platform_tasks.cli.dead_letter_selection import parse_since as parse_since
from platform_tasks.cli.terminal_text import printable, printable_json
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.store import (
    REPLAY_BATCH_SIZE,
    STATUSES,
    DeadLetterFilter,
    ReplayReport,
    discard_dead_letters,
    get_dead_letter,
    iter_dead_letters,
    list_dead_letters,
    replay_dead_letters,
)
from platform_tasks.errors import ReplayError
from platform_tasks.operations.bulk import BULK_BATCH_SIZE
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.operations.publisher import ReplayPublisher
from platform_tasks.settings import PlatformSettings, redact_url


@contextmanager
def _connection(settings: PlatformSettings | None = None) -> Iterator[Connection]:
    settings = settings or database_settings()
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
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _first_line(text: str | None, width: int = 60) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _cell(value: object) -> Text:
    """A table cell: stored text is data, never console markup or a terminal sequence."""
    return Text("" if value is None else printable(str(value)))


def _table(rows: list[DeadLetter]) -> Table:
    table = Table(title=f"dead letters ({len(rows)})", title_justify="left")
    for name in (
        "id",
        "status",
        "queue",
        "kind",
        "tenant",
        "job_id",
        "attempts",
        "reason",
        "error",
        "created (UTC)",
        "replays",
    ):
        table.add_column(
            name,
            no_wrap=name not in ("error",),
            justify="right" if name in ("id", "attempts", "replays") else "left",
        )
    for row in rows:
        table.add_row(
            *(
                _cell(value)
                for value in (
                    row.id,
                    row.status,
                    row.queue,
                    row.kind,
                    row.tenant_id,
                    row.job_id,
                    row.attempts,
                    row.reason,
                    row.error_type or _first_line(row.last_error),
                    _when(row.created_at),
                    row.replay_count,
                )
            )
        )
    return table


def _echo_json_stream(items: Iterator[dict[str, Any]]) -> None:
    """A JSON array written item by item, so a long listing is never held in memory."""
    click.echo("[", nl=False)
    first = True
    for item in items:
        text = json.dumps(item, indent=2, sort_keys=True, default=str)
        click.echo(("\n" if first else ",\n") + "  " + text.replace("\n", "\n  "), nl=False)
        first = False
    click.echo("\n]" if not first else "]")


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@click.group("dead-letters")
def dead_letters() -> None:
    """Review and act on rows of core.dead_letters."""


@dead_letters.command("list")
@filter_options
@click.option("--status", type=click.Choice(STATUSES), help="Only rows in this status.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many rows, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array for scripts.")
def list_command(
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    since: datetime | None,
    status: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List dead letters, newest first. Exits 0 even when there are none."""
    where = DeadLetterFilter(
        queue=queue, kind=kind, tenant_id=tenant_id, status=status, since=since
    )
    with _connection() as conn:
        if as_json:
            _echo_json_stream(row.to_json() for row in iter_dead_letters(conn, where, limit=limit))
            return
        with conn.cursor() as cur:
            rows = list_dead_letters(cur, where, limit=limit, with_payload=False)
    if rows:
        _console().print(_table(rows))
    else:
        click.echo("no dead letters match")


@dead_letters.command("show")
@click.argument("dead_letter_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the row as JSON.")
def show_command(dead_letter_id: int, as_json: bool) -> None:
    """Show one dead letter with its payload and full error. Exits 1 when not found."""
    with _connection() as conn, conn.cursor() as cur:
        row = get_dead_letter(cur, dead_letter_id)
    if row is None:
        click.echo(f"dead letter {dead_letter_id} not found", err=True)
        sys.exit(NOTHING_MATCHED)
    data = row.to_json()
    if as_json:
        _echo_json(data)
        return
    table = Table(show_header=False, title=f"dead letter {row.id}", title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in data.items():
        if key not in ("payload", "last_error"):
            table.add_row(key, _cell(value))
    console = _console()
    console.print(table)
    console.print("payload:", style="bold")
    console.print_json(json.dumps(printable_json(row.payload), default=str))
    console.print("last_error:", style="bold")
    console.print(printable(row.last_error or "", multiline=True), markup=False, highlight=False)


def _report_json(report: ReplayReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run,
        "replayed": [
            {"id": r.id, "job_id": str(r.job_id), "queue": r.queue} for r in report.replayed
        ],
        "refused": [{"id": i, "why": why} for i, why in report.refused],
        "not_pending": [{"id": i, "status": status} for i, status in report.not_pending],
    }


def _print_report(report: ReplayReport) -> None:
    verb = "would replay" if report.dry_run else "replayed"
    for row in report.replayed:
        click.echo(f"{verb} {row.id}: job {row.job_id} to queue {printable(str(row.queue))}")
    for row_id, why in report.refused:
        click.echo(f"refused {row_id}: {printable(str(why))}", err=True)
    for row_id, status in report.not_pending:
        click.echo(f"skipped {row_id}: {printable(str(status))}", err=True)
    click.echo(
        f"{verb} {len(report.replayed)}, refused {len(report.refused)}, "
        f"skipped {len(report.not_pending)}"
    )


@dead_letters.command("replay")
@click.argument("ids", metavar="[ID]...", nargs=-1, type=int)
@filter_options
@click.option("--all", "replay_all", is_flag=True, help="Replay every pending row.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
@click.option(
    "--app",
    "app_spec",
    envvar="PLATFORM_APP",
    default=None,
    show_envvar=True,
    help="Publish with this application (module:attr, imported like celery -A) instead of "
    "the platform settings alone; for custom routing.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help=f"Rows locked, published and committed per transaction [default: "
    f"{REPLAY_BATCH_SIZE} by IDs, {BULK_BATCH_SIZE} by filter].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@bulk_options
def replay_command(
    ids: tuple[int, ...],
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    since: datetime | None,
    replay_all: bool,
    dry_run: bool,
    app_spec: str | None,
    batch_size: int | None,
    as_json: bool,
    options: BulkOptions,
) -> None:
    """Republish pending dead letters to their original queue with their original job id.

    Select rows by ID, by filters (both together narrow the selection), or every pending
    row with --all. Rows are marked replayed; a row another replay is handling at the same
    moment is left to it, so each row is published once. Rows that hold no readable
    envelope are refused. Needs only the platform settings (database, broker), not the
    application's code. Exits 1 when nothing was replayed.

    Without IDs the replay is one operation logged in core.operations (who: --actor),
    run 500 rows per transaction; rerunning the same filter after a crash continues it,
    as does --operation N. At a terminal it asks first unless --yes.
    """
    where, bulk_filter = selection(ids, queue, kind, tenant_id, since, options)
    require_selection(ids, bulk_filter, replay_all, options, "replay", "IDs or filters")
    settings = database_settings()
    # Opened only once a row is to be published: a replay that matches nothing imports no
    # application and opens no broker connection.
    publisher = ReplayPublisher(
        settings, load_app=(lambda: load_app(app_spec)) if app_spec else None
    )
    with publisher:
        if not ids:
            _replay_by_filter(
                settings,
                bulk_filter,
                publisher,
                options,
                dry_run=dry_run,
                everything=replay_all,
                batch_size=batch_size or BULK_BATCH_SIZE,
                as_json=as_json,
            )
            return
        _replay_by_ids(
            settings,
            publisher,
            ids,
            where,
            dry_run=dry_run,
            batch_size=batch_size or REPLAY_BATCH_SIZE,
            as_json=as_json,
        )


def _replay_by_ids(
    settings: PlatformSettings,
    publisher: ReplayPublisher,
    ids: tuple[int, ...],
    where: DeadLetterFilter,
    *,
    dry_run: bool,
    batch_size: int,
    as_json: bool,
) -> None:
    """The by-ID replay: no operation is logged (the IDs are the record); the report is
    printed once the rows are committed. Exits 1 when nothing was replayed."""
    from platform_tasks.cli.bulk_dead_letters import NOTHING_REPLAYED

    try:
        with _connection(settings) as conn:
            report = replay_dead_letters(
                conn,
                open_publish=publisher.open,
                ids=list(ids) or None,
                where=where,
                dry_run=dry_run,
                batch_size=batch_size,
                max_bytes=settings.max_payload_bytes,
            )
    except ReplayError as exc:
        raise cli_error(exc, settings) from None
    if as_json:
        _echo_json(_report_json(report))
    else:
        _print_report(report)
    exit_if_nothing(len(report.replayed), NOTHING_REPLAYED, as_json=as_json)


def _replay_by_filter(
    settings: PlatformSettings,
    where: OperationFilter,
    publisher: ReplayPublisher,
    options: BulkOptions,
    *,
    dry_run: bool,
    everything: bool,
    batch_size: int,
    as_json: bool,
) -> None:
    """The filter form of replay: one logged operation, previewed (``--dry-run``) or
    confirmed at a terminal first; imported lazily as the bulk modules are only needed
    here."""
    from platform_tasks.cli import bulk_dead_letters as bulk

    if dry_run:
        with _connection(settings) as conn:
            bulk.dry_run(settings, conn, where, as_json)
        return
    bulk.confirm(settings, where, "replay", options.yes)
    bulk.replay(
        settings,
        where,
        everything=everything,
        open_publish=publisher.open,
        batch_size=batch_size,
        actor=options.actor,
        operation_id=options.operation_id,
        as_json=as_json,
    )


@dead_letters.command("discard")
@click.argument("ids", metavar="[ID]...", nargs=-1, type=int)
@click.option("--reason", required=True, help="Why these rows will not be replayed (stored).")
@filter_options
@click.option("--all", "discard_all", is_flag=True, help="Discard every pending row.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=BULK_BATCH_SIZE,
    show_default=True,
    help="Rows marked and committed per transaction (filter form).",
)
@click.option("--dry-run", is_flag=True, help="Show how many rows match; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@bulk_options
def discard_command(
    ids: tuple[int, ...],
    reason: str,
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    since: datetime | None,
    discard_all: bool,
    batch_size: int,
    dry_run: bool,
    as_json: bool,
    options: BulkOptions,
) -> None:
    """Mark pending dead letters discarded, keeping the reason. Exits 1 if none matched.

    By IDs, or by filters / --all as one operation logged in core.operations (batched,
    continued by a rerun of the same filter or --operation N).
    """
    if not reason.strip():
        raise click.BadParameter("must not be empty", param_hint="--reason")
    _, bulk_filter = selection(ids, queue, kind, tenant_id, since, options)
    if not ids:
        require_selection(ids, bulk_filter, discard_all, options, "discard", "filters")
        _discard_by_filter(
            bulk_filter,
            options,
            reason=reason,
            everything=discard_all,
            batch_size=batch_size,
            dry_run=dry_run,
            as_json=as_json,
        )
        return
    if discard_all or dry_run:
        raise click.UsageError("--all and --dry-run apply to the filter form, not to IDs")
    with _connection() as conn:
        report = discard_dead_letters(conn, list(ids), reason=reason)
    for row_id in report.discarded:
        click.echo(f"discarded {row_id}")
    for row_id, status in report.not_pending:
        click.echo(f"skipped {row_id}: {status}", err=True)
    if not report.discarded:
        click.echo("nothing discarded: no pending dead letter matched", err=True)
        sys.exit(NOTHING_MATCHED)


def _discard_by_filter(
    bulk_filter: OperationFilter,
    options: BulkOptions,
    *,
    reason: str,
    everything: bool,
    batch_size: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    """The filter form of discard: one logged operation, previewed (``--dry-run``) or
    confirmed at a terminal first; imported lazily as the bulk modules are only needed
    here."""
    from platform_tasks.cli import bulk_dead_letters as bulk
    from platform_tasks.operations.bulk import preview_dead_letters

    settings = database_settings()
    if dry_run:
        preview = preview_dead_letters(settings, bulk_filter, sample_size=0)
        click.echo(f"would discard {preview.matched} (nothing changed)")
        if not preview.matched:
            sys.exit(NOTHING_MATCHED)
        return
    bulk.confirm(settings, bulk_filter, "discard", options.yes)
    bulk.discard(
        settings,
        bulk_filter,
        reason=reason,
        everything=everything,
        batch_size=batch_size,
        actor=options.actor,
        operation_id=options.operation_id,
        as_json=as_json,
    )
