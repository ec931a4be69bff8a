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

from platform_tasks.cli.common import NOTHING_MATCHED, cli_error, exit_if_nothing
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

NOTHING_DISCARDED = "nothing discarded: no pending dead letter matched"
NOTHING_REPLAYED = "nothing replayed: no pending dead letter with a readable envelope matched"


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
    stream = _StreamedArray('{"dry_run": true, "replayed": [') if as_json else None
    rows = iter_matching(conn, where, max_bytes=settings.max_payload_bytes)
    for row_id, job_id, queue, why in rows:
        if why:
            refused += 1
            if as_json:
                refusals.append({"id": row_id, "why": why})
            else:
                click.echo(f"refused {row_id}: {printable(why)}", err=True)
            continue
        if stream is not None:
            stream.add(_row_item(row_id, job_id, queue))
        else:
            click.echo(f"would replay {row_id}: job {job_id} to queue {printable(str(queue))}")
        would += 1
    if stream is not None:
        stream.close({"not_pending": [], "refused": refusals})
    else:
        click.echo(f"would replay {would}, refused {refused} (nothing changed)")
    if not would:
        sys.exit(NOTHING_MATCHED)


class _StreamedArray:
    """A JSON object whose first array is printed item by item as rows are committed, so
    the output of a long run is never held in memory; the object's other keys follow."""

    def __init__(self, head: str) -> None:
        self.empty = True
        click.echo(head, nl=False)

    def add(self, item: dict[str, Any]) -> None:
        """Print one array item (a separator first, unless it is the first)."""
        click.echo(("\n  " if self.empty else ",\n  ") + json.dumps(item), nl=False)
        self.empty = False

    def close(self, rest: dict[str, Any]) -> None:
        """End the array and the object with ``rest``'s keys (sorted, as ``--json`` is)."""
        tail = json.dumps(rest, sort_keys=True)[1:]
        click.echo(("\n]" if not self.empty else "]") + ", " + tail)


def _row_item(row_id: int, job_id: Any, queue: Any) -> dict[str, Any]:
    """A replayed row as ``--json`` prints it (the same keys as the by-ID form)."""
    return {"id": row_id, "job_id": str(job_id), "queue": queue}


def _batch_printer(stream: _StreamedArray | None) -> Callable[[Outcome], None]:
    """The ``on_batch`` callback: print each committed batch's rows as soon as it commits,
    so a crash mid-run still shows what was replayed."""

    def printed(batch: Outcome) -> None:
        for row in batch.replayed:
            if stream is not None:
                stream.add(_row_item(row.id, row.job_id, row.queue))
            else:
                click.echo(
                    f"replayed {row.id}: job {row.job_id} to queue {printable(str(row.queue))}"
                )
        for row_id, why in batch.refused:
            click.echo(f"refused {row_id}: {printable(why)}", err=True)

    return printed


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
    stream = _StreamedArray('{"dry_run": false, "replayed": [') if as_json else None
    try:
        result = bulk_replay(
            settings,
            where,
            actor=actor,
            open_publish=open_publish,
            batch_size=batch_size,
            allow_empty_filter=everything,
            operation_id=operation_id,
            on_batch=_batch_printer(stream),
        )
    except ReplayError as exc:
        if as_json:
            click.echo("\n]}")
        raise cli_error(exc, settings) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if stream is not None:
        stream.close(
            {
                "operation": result.operation.to_json(),
                "resumed": result.resumed,
                "refused": [{"id": i, "why": why} for i, why in result.refused],
                "not_pending": [],
            }
        )
    else:
        click.echo(_operation_line(result, "replayed"))
    exit_if_nothing(result.operation.done, NOTHING_REPLAYED, as_json=as_json)


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
    exit_if_nothing(result.operation.done, NOTHING_DISCARDED, as_json=as_json)
