"""The console's batches pages: the list (newest first, counts by outcome, callbacks fired)
and one batch (counts by tenant, callbacks with their times, where its children are).

Both read :mod:`platform_tasks.batches.status`, the read model of ``platform-tasks
batches list|show``, on the platform's database (``PLATFORM_DATABASE_URL``), so the
console and the CLI cannot disagree. They only read: a batch has no action here (replay a
child's dead letter from the dead-letters page; the batch re-opens by itself).

Where the outstanding children are costs a look into the delay store and a question to
the workers (up to a second), so the batch page shows it only when asked (``?where=1``,
the page's "Where are they?" link).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import psycopg2
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from psycopg2.extensions import connection as Connection

from platform_tasks.batches import status
from platform_tasks.batches.locator import WorkerAndDelayLocator
from platform_tasks.contrib.django.platform import platform_settings, safe_error

__all__ = ["batch_page", "batches_page"]

PAGE_SIZE = 50
OUTCOMES = ("applied", "dead_lettered", "discarded", "cancelled", "outstanding")


@contextlib.contextmanager
def _connection() -> Iterator[Connection]:
    settings = platform_settings()
    conn = psycopg2.connect(
        settings.database_url, connect_timeout=10, application_name="platform-tasks console"
    )
    try:
        yield conn
    finally:
        conn.close()


@lru_cache(maxsize=1)
def _app() -> Any:
    """An app built from the platform settings, to ask the workers what they run (the
    console has no application of its own)."""
    from platform_tasks.app import PLATFORM_APP_NAME, create_app

    return create_app(PLATFORM_APP_NAME, settings=platform_settings())


def _row(summary: status.BatchSummary) -> dict[str, Any]:
    counts = summary.counts.to_json()
    return {
        "summary": summary,
        "counts": [counts[name] for name in OUTCOMES],
        "callbacks": [c for c in summary.callbacks if c.is_set],
    }


def _before(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


def batches_page(admin_site: Any, request: HttpRequest) -> HttpResponse:
    """Batches, newest first (``?before=`` the next page, ``?open=1`` open ones only)."""
    open_only = request.GET.get("open") == "1"
    before = _before(request.GET.get("before"))
    context: dict[str, Any] = {
        **admin_site.each_context(request),
        "title": "Batches",
        "outcomes": OUTCOMES,
        "open_only": open_only,
    }
    try:
        with _connection() as conn:
            rows = status.list_batches(
                conn, limit=PAGE_SIZE + 1, before=before, open_only=open_only
            )
    except Exception as exc:
        context["batches_error"] = safe_error(exc)
    else:
        context["batches"] = [_row(row) for row in rows[:PAGE_SIZE]]
        if len(rows) > PAGE_SIZE:
            context["next_before"] = rows[PAGE_SIZE - 1].created_at.isoformat()
    return TemplateResponse(request, "platform_console/batches.html", context)


def batch_page(admin_site: Any, request: HttpRequest, batch_id: str) -> HttpResponse:
    """One batch; with ``?where=1``, where its outstanding children are."""
    try:
        wanted = uuid.UUID(batch_id)
    except ValueError:
        raise Http404(f"{batch_id!r} is not a batch id") from None
    where = request.GET.get("where") == "1"
    context: dict[str, Any] = {
        **admin_site.each_context(request),
        "title": f"Batch {wanted}",
        "outcomes": OUTCOMES,
        "where": where,
    }
    try:
        locator = WorkerAndDelayLocator(platform_settings(), app=_app()) if where else None
        with _connection() as conn:
            detail = status.show_batch(conn, wanted, locator=locator)
    except Exception as exc:
        context["batch_error"] = safe_error(exc)
        return TemplateResponse(request, "platform_console/batch.html", context)
    if detail is None:
        raise Http404(f"no batch {wanted}")
    context.update(
        batch=_row(detail.summary),
        all_callbacks=detail.summary.callbacks,
        tenants=[
            {"tenant_id": t.tenant_id, "counts": [t.counts.to_json()[n] for n in OUTCOMES]}
            for t in detail.tenants
        ],
        tenant_total=detail.tenant_total,
        places=detail.places,
    )
    return TemplateResponse(request, "platform_console/batch.html", context)
