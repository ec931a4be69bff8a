"""The dead-letter list's filters, and the bulk filter the current list stands for.

Each list filter's URL parameter is the name of the matching :class:`OperationFilter`
field (``queue``, ``kind``, ``tenant_id``, ``error_type``) and the time window is
Django's date filter on ``created_at`` (``created_at__gte`` / ``created_at__lt``), so a
bulk action "by the current filter" reads the list's own query string. A search (``q``)
has no bulk equivalent: a bulk action from a searched list is refused, saying so,
rather than acting on more rows than the list shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib import admin

from platform_tasks.operations import OperationFilter

__all__ = [
    "BULK_FIELDS",
    "ErrorTypeFilter",
    "FilterRefused",
    "KindFilter",
    "QueueFilter",
    "StatusFilter",
    "TenantFilter",
    "bulk_filter",
]

DISTINCT_SHOWN = 50
SCANNED = 10_000
"""A filter's sidebar lists up to :data:`DISTINCT_SHOWN` values (sorted) found among the
newest :data:`SCANNED` dead letters; any other value still works in the URL
(``?tenant_id=acme``)."""

BULK_FIELDS = ("queue", "kind", "tenant_id", "error_type")
TIME_FIELDS = {"created_at__gte": "since", "created_at__lt": "until"}
IGNORED = {"o", "p", "all", "_changelist_filters", "status", "e"}
"""Ordering, paging and the status filter do not change what a bulk action acts on (it
acts on pending rows)."""


class FilterRefused(ValueError):
    """The list's query cannot be expressed as a bulk filter (the message says why)."""


class _DistinctValues(admin.SimpleListFilter):
    field = ""

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        # Values of the newest rows only: a DISTINCT over millions of rows on every page
        # view would cost more than the page.
        newest = model_admin.model.objects.order_by("-created_at").values("pk")[:SCANNED]
        rows = (
            model_admin.model.objects.filter(pk__in=newest)
            .exclude(**{f"{self.field}__isnull": True})
            .values_list(self.field, flat=True)
            .order_by(self.field)
            .distinct()[:DISTINCT_SHOWN]
        )
        values = [str(value) for value in rows]
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(value, value) for value in values]

    def queryset(self, request: Any, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class QueueFilter(_DistinctValues):
    title = "queue"
    parameter_name = field = "queue"


class KindFilter(_DistinctValues):
    title = "kind"
    parameter_name = field = "kind"


class TenantFilter(_DistinctValues):
    title = "tenant"
    parameter_name = field = "tenant_id"


class ErrorTypeFilter(_DistinctValues):
    title = "error type"
    parameter_name = field = "error_type"


class StatusFilter(admin.SimpleListFilter):
    """Pending rows by default (what needs review); ``all`` shows every status."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("replayed", "replayed"), ("discarded", "discarded"), ("all", "all")]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() in (None, "pending_review"),
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "pending review",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: Any, queryset: Any) -> Any:
        value = self.value()
        if value == "all":
            return queryset
        return queryset.filter(status=value or "pending_review")


def _time(value: str, name: str) -> datetime:
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise FilterRefused(f"{name}: {value!r} is not an ISO 8601 time") from None


def bulk_filter(query: Mapping[str, str]) -> OperationFilter:
    """The bulk filter of a dead-letter list's query string (or of a confirmation form).

    Refuses a search and any parameter it does not know, naming it, instead of
    silently acting on a wider set than the operator looked at."""
    values: dict[str, Any] = {}
    for key, value in query.items():
        if key in IGNORED or value == "":
            continue
        if key in BULK_FIELDS:
            values[key] = value
        elif key in TIME_FIELDS:
            values[TIME_FIELDS[key]] = _time(value, key)
        elif key == "q":
            raise FilterRefused(
                "a search cannot select the rows of a bulk action; clear the search and "
                "narrow the list with the filters (queue, kind, tenant, error type, date)"
            )
        else:
            raise FilterRefused(f"the list parameter {key!r} is not a bulk filter field")
    try:
        return OperationFilter(**values)
    except ValueError as exc:
        raise FilterRefused(str(exc)) from None
