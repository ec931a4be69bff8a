"""The filter form of ``platform-tasks dead-letters replay|discard``: one recorded operation.

``replay``/``discard`` given filters (or ``--all``) instead of ids run
:func:`~platform_tasks.operations.bulk.bulk_replay` /
:func:`~platform_tasks.operations.bulk.bulk_discard`: batched, safe beside a concurrent
run of the same filter, continued by a rerun after a crash, logged in
``core.operations``. Rows are printed batch by batch as they are committed, so the
output of a long run is never held in memory (``--json`` prints one JSON object whose
``replayed`` array is streamed the same way).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from platform_tasks.cli.common import cli_error
from platform_tasks.cli.terminal_text import printable
from platform_tasks.dead_letters.batch import Outcome, Publish
from platform_tasks.errors import ReplayError
from platform_tasks.operations.bulk import (
    BulkResult,
    bulk_discard,
    bulk_replay,
    iter_matching,
    preview_dead_letters,
)
from platform_tasks.operations.filters import OperationFilter
from platform_tasks.settings import PlatformSettings

NOTHING_MATCHED = 1


def confirm(settings: PlatformSettings, where: OperationFilter, verb: str, yes: bool) -> None:
    """Ask before acting when a person is at the terminal and did not pass ``--yes``.

    Scripts (stdin not a terminal) are not asked, as before these commands logged
    operations; ``--dry-run`` shows the same preview without acting.
    """
    if yes or not sys.stdin.isatty():
        return
    preview = preview_dead_letters(settings, where, sample_size=5)
    click.echo(f"{preview.matched} pending dead letter(s) match {printable(where.describe())}")
    for row in preview.sample:
        click.echo(
            f"  {row.id}: {printable(str(row.queue))} {printable(str(row.kind))} "
            f"tenant={printable(str(row.tenant_id))} {printable(str(row.error_type))}"
        )
    if not click.confirm(f"{verb} them?", default=False):
        raise click.Abort()


def _operation_line(result: BulkResult, verb: str) -> str:
    op = result.operation
    how = "continued" if result.resumed else "ran"
    return (
        f"operation {op.id} ({how}, {op.outcome}): {verb} {op.done}, refused {op.failed} "
        f"of {op.matched} matched"
    )


def dry_run(settings: PlatformSettings, conn: Any, where: OperationFilter, as_json: bool) -> None:
    """Print what a replay of ``where`` would do, row by row (``--json``: the same object
    as before, its ``replayed`` array streamed); exit 1 when nothing would be replayed."""
    would = refused = 0
    refusals: list[dict[str, Any]] = []
    if as_json:
        click.echo('{"dry_run": true, "replayed": [', nl=False)
    rows = iter_matching(conn, where, max_bytes=settings.max_payload_bytes)
    for row_id, job_id, queue, why in rows:
        if why:
            refused += 1
            if as_json:
                refusals.append({"id": row_id, "why": why})
            else:
                click.echo(f"refused {row_id}: {printable(why)}", err=True)
            continue
        if as_json:
            item = json.dumps({"id": row_id, "job_id": str(job_id), "queue": queue})
            click.echo(("\n  " if not would else ",\n  ") + item, nl=False)
        else:
            click.echo(f"would replay {row_id}: job {job_id} to queue {printable(str(queue))}")
        would += 1
    if as_json:
        tail = json.dumps({"not_pending": [], "refused": refusals}, sort_keys=True)[1:]
        click.echo(("\n]" if would else "]") + ", " + tail)
    else:
        click.echo(f"would replay {would}, refused {refused} (nothing changed)")
    if not would:
        sys.exit(NOTHING_MATCHED)


def replay(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    everything: bool,
    open_publish: Callable[[], Publish],
    batch_size: int,
    actor: str | None,
    operation_id: int | None,
    as_json: bool,
) -> None:
    """Run the bulk replay, printing each committed batch; exit 1 when nothing replayed."""
    first = [True]
    if as_json:
        click.echo('{"dry_run": false, "replayed": [', nl=False)

    def printed(batch: Outcome) -> None:
        for row in batch.replayed:
            if as_json:
                item = json.dumps({"id": row.id, "job_id": str(row.job_id), "queue": row.queue})
                click.echo(("\n  " if first[0] else ",\n  ") + item, nl=False)
                first[0] = False
            else:
                click.echo(
                    f"replayed {row.id}: job {row.job_id} to queue {printable(str(row.queue))}"
                )
        for row_id, why in batch.refused:
            click.echo(f"refused {row_id}: {printable(why)}", err=True)

    try:
        result = bulk_replay(
            settings,
            where,
            actor=actor,
            open_publish=open_publish,
            batch_size=batch_size,
            allow_empty_filter=everything,
            operation_id=operation_id,
            on_batch=printed,
        )
    except ReplayError as exc:
        if as_json:
            click.echo("\n]}")
        raise cli_error(exc, settings) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    op = result.operation
    if as_json:
        summary = {
            "operation": op.to_json(),
            "resumed": result.resumed,
            "refused": [{"id": i, "why": why} for i, why in result.refused],
            "not_pending": [],
        }
        tail = json.dumps(summary, sort_keys=True)[1:]
        click.echo(("\n]" if not first[0] else "]") + ", " + tail)
    else:
        click.echo(_operation_line(result, "replayed"))
    if op.done == 0:
        if not as_json:
            click.echo(
                "nothing replayed: no pending dead letter with a readable envelope matched",
                err=True,
            )
        sys.exit(NOTHING_MATCHED)


def discard(
    settings: PlatformSettings,
    where: OperationFilter,
    *,
    reason: str,
    everything: bool,
    batch_size: int,
    actor: str | None,
    operation_id: int | None,
    as_json: bool,
) -> None:
    """Run the bulk discard; exit 1 when nothing was discarded."""
    try:
        result = bulk_discard(
            settings,
            where,
            reason=reason,
            actor=actor,
            batch_size=batch_size,
            allow_empty_filter=everything,
            operation_id=operation_id,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {"operation": result.operation.to_json(), "resumed": result.resumed},
                indent=2,
                sort_keys=True,
            )
        )
    else:
        click.echo(_operation_line(result, "discarded"))
    if result.operation.done == 0:
        if not as_json:
            click.echo("nothing discarded: no pending dead letter matched", err=True)
        sys.exit(NOTHING_MATCHED)
