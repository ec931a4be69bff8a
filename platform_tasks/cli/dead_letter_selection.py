"""Which rows a ``platform-tasks dead-letters`` command selects: its options and checks.

``list``, ``replay`` and ``discard`` share the filter options (``--queue``, ``--kind``,
``--tenant``, ``--since``); ``replay`` and ``discard`` also share the filter form's
options (``--error-type``, ``--until``, ``--yes``, ``--actor``, ``--operation``), read
into one :class:`BulkOptions` so both commands check a selection the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any

import click

from platform_tasks.dead_letters.store import DeadLetterFilter
from platform_tasks.operations.filters import OperationFilter

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str, *, now: datetime | None = None) -> datetime:
    """``30m``, ``6h``, ``7d``, ``2w`` ago, or an ISO 8601 time (naive means UTC)."""
    text = value.strip()
    match = _RELATIVE.match(text)
    if match:
        delta = timedelta(**{_UNITS[match[2]]: int(match[1])})
        return (now or datetime.now(UTC)) - delta
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration like 6h/7d nor an ISO 8601 time", param_hint="--since"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class _Since(click.ParamType):  # type: ignore[type-arg]
    name = "WHEN"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_since(str(value))
        except click.BadParameter as exc:
            if param is not None:  # name the option given (--since or --until)
                exc.param, exc.param_hint = param, None
            raise


SINCE = _Since()


def filter_options(func: Any) -> Any:
    """The filter options every dead-letters command that selects rows shares."""
    options = [
        click.option("--queue", help="Only rows of this queue."),
        click.option("--kind", help="Only rows of this job kind (task name)."),
        click.option("--tenant", "tenant_id", help="Only rows of this tenant."),
        click.option("--since", type=SINCE, help="Only rows created since: 6h, 7d, or ISO time."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@dataclass(frozen=True)
class BulkOptions:
    """The filter form's options of replay/discard, read once for both commands."""

    error_type: str | None
    until: datetime | None
    yes: bool
    actor: str | None
    operation_id: int | None


def bulk_options(func: Callable[..., None]) -> Any:
    """Options of the filter form of replay/discard (one logged operation), handed to the
    command as one ``options: BulkOptions`` so both commands read them the same way."""

    @wraps(func)
    def command(
        *args: Any,
        error_type: str | None,
        until: datetime | None,
        yes: bool,
        actor: str | None,
        operation_id: int | None,
        **kwargs: Any,
    ) -> None:
        func(*args, options=BulkOptions(error_type, until, yes, actor, operation_id), **kwargs)

    options = [
        click.option("--error-type", help="Only rows with this error type (e.g. TimeoutError)."),
        click.option("--until", type=SINCE, help="Only rows created before: 6h, 7d, or ISO time."),
        click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
        click.option(
            "--actor",
            envvar="PLATFORM_ACTOR",
            default=None,
            help="Who runs the operation (logged); default: the OS user.",
        ),
        click.option(
            "--operation",
            "operation_id",
            type=int,
            default=None,
            help="Continue this unfinished operation, with its stored filter.",
        ),
    ]
    wrapped: Any = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


def bulk_filter(
    ids: tuple[int, ...], where: DeadLetterFilter, options: BulkOptions
) -> OperationFilter:
    """The filter of the bulk form; its extra options are refused beside IDs."""
    if ids and (options.error_type or options.until or options.operation_id is not None):
        raise click.UsageError(
            "--error-type, --until and --operation select rows by filter; "
            "do not combine them with IDs"
        )
    try:
        return OperationFilter(
            queue=where.queue,
            kind=where.kind,
            tenant_id=where.tenant_id,
            error_type=options.error_type,
            since=where.since,
            until=options.until,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def selection(
    ids: tuple[int, ...],
    queue: str | None,
    kind: str | None,
    tenant_id: str | None,
    since: datetime | None,
    options: BulkOptions,
) -> tuple[DeadLetterFilter, OperationFilter]:
    """The rows replay/discard act on: the by-ID filter and the filter form's, read the
    same way by both commands."""
    where = DeadLetterFilter(queue=queue, kind=kind, tenant_id=tenant_id, since=since)
    return where, bulk_filter(ids, where, options)


def require_selection(
    ids: tuple[int, ...],
    bulk_filter: OperationFilter,
    everything: bool,
    options: BulkOptions,
    verb: str,
    selection: str,
) -> None:
    """Refuse a replay/discard that names no rows (acting on every row takes ``--all``),
    or that gives ``--all`` beside a ``selection`` (what the command can select by)."""
    if not ids and bulk_filter.is_empty and not everything and options.operation_id is None:
        raise click.UsageError(
            f"give dead letter IDs, filters, or --all to {verb} every pending row"
        )
    if everything and (ids or not bulk_filter.is_empty):
        raise click.UsageError(
            f"--all {verb}s every pending row; do not combine it with {selection}"
        )
