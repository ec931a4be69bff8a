"""The dead-letter list's query string read as a bulk filter: every list filter maps to
its field, and anything that would make a bulk action act on more (or other) rows than
the list shows is refused, naming the parameter."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from platform_tasks.contrib.django.filters import FilterRefused, bulk_filter
from platform_tasks.operations import OperationFilter


def test_list_filters_map_to_the_bulk_filter_fields() -> None:
    where = bulk_filter(
        {
            "queue": "mail",
            "kind": "mail.send",
            "tenant_id": "acme",
            "error_type": "TimeoutError",
            "created_at__gte": "2026-12-01 00:00:00+00:00",
            "created_at__lt": "2026-12-02",
            "o": "2",
            "p": "3",
            "status": "all",
            "_changelist_filters": "x",
        }
    )
    assert where == OperationFilter(
        queue="mail",
        kind="mail.send",
        tenant_id="acme",
        error_type="TimeoutError",
        since=datetime(2026, 12, 1, tzinfo=UTC),
        until=datetime(2026, 12, 2, tzinfo=UTC),
    )


def test_no_filter_is_the_empty_filter() -> None:
    assert bulk_filter({"o": "1"}).is_empty


def test_a_search_is_refused() -> None:
    with pytest.raises(FilterRefused, match="search"):
        bulk_filter({"tenant_id": "acme", "q": "timeout"})


def test_an_unknown_parameter_is_refused_by_name() -> None:
    with pytest.raises(FilterRefused, match="'attempts__gte'"):
        bulk_filter({"attempts__gte": "3"})


def test_a_bad_time_is_refused_by_name() -> None:
    with pytest.raises(FilterRefused, match="created_at__gte"):
        bulk_filter({"created_at__gte": "yesterday"})


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(FilterRefused, match="until"):
        bulk_filter({"created_at__gte": "2026-12-02", "created_at__lt": "2026-12-01"})
