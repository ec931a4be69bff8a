"""The console's admin pages: dead letters, the operations log, queues, batches.

Everything here only reads (the models are unmanaged and nobody may add, change or
delete a row through the admin); actions are the confirmation pages of
:mod:`platform_tasks.contrib.django.views`, reached by buttons shown only to users with
the action's permission. What a dead letter carries (its payload beyond the envelope's
metadata, its error text, a search over that text) needs ``view_dead_letter_payload``:
everyone else sees the error type. Stored text (errors, payloads, tenant names) is
rendered through Django's escaping (``format_html``), never marked safe as it is.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import path

from platform_tasks.contrib.django import batch_pages, permissions, views
from platform_tasks.contrib.django.apps import APP_LABEL
from platform_tasks.contrib.django.filters import (
    ErrorTypeFilter,
    KindFilter,
    QueueFilter,
    StatusFilter,
    TenantFilter,
)
from platform_tasks.contrib.django.models import Batch, DeadLetter, Operation, Queue
from platform_tasks.contrib.django.payloads import error_html, payload_html

__all__ = ["BatchAdmin", "DeadLetterAdmin", "OperationAdmin", "QueueAdmin"]


class _ReadOnly(admin.ModelAdmin):
    actions = None

    def check_view(self, request: HttpRequest) -> None:
        """403 unless the user may view this model (the admin only checks is_staff)."""
        if not self.has_view_permission(request):
            raise PermissionDenied

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _sees_data(request: HttpRequest) -> bool:
    return permissions.has(request.user, permissions.VIEW_PAYLOAD)


@admin.register(DeadLetter)
class DeadLetterAdmin(_ReadOnly):
    list_display = (
        "id",
        "dead_lettered_at",
        "queue",
        "kind",
        "tenant_id",
        "error_type",
        "error_start",
        "attempts",
        "status",
    )
    list_display_links = ("id",)
    list_filter = (
        StatusFilter,
        QueueFilter,
        KindFilter,
        TenantFilter,
        ErrorTypeFilter,
        "created_at",
    )
    search_fields = ("last_error", "error_type", "kind", "tenant_id", "correlation_id")
    TEXT_FIELDS = frozenset({"last_error", "error_start"})
    """Columns and search fields over the error text: customer data (a database error
    quotes the refused value), for users with ``view_dead_letter_payload`` only."""
    METADATA_FIELDS = frozenset(
        {
            "id",
            "job_id",
            "queue",
            "kind",
            "tenant_id",
            "attempts",
            "error_type",
            "reason",
            "status",
            "correlation_id",
            "created_at",
            "updated_at",
            "replay_count",
            "replayed_at",
            "discarded_at",
        }
    )
    """The columns everyone may filter on in the list's URL. Django's admin lets a URL
    filter on any column (``?last_error__icontains=alice``, ``?payload__data__card__
    startswith=4``): an oracle for what the page hides, so a user without
    ``view_dead_letter_payload`` may filter on these only."""
    show_full_result_count = False  # a count(*) over millions of rows per page view
    list_per_page = 50
    fields = (
        "id",
        "job_id",
        "status",
        "queue",
        "kind",
        "tenant_id",
        "correlation_id",
        "created_at",
        "attempts",
        "reason",
        "error_type",
        "error",
        "payload",
        "replay_count",
        "replayed_at",
        "discard_reason",
        "discarded_at",
        "updated_at",
    )
    change_list_template = "platform_console/deadletter_change_list.html"

    @admin.display(description="dead-lettered at", ordering="created_at")
    def dead_lettered_at(self, obj: DeadLetter) -> str:
        return str(obj.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))

    @admin.display(description="error")
    def error_start(self, obj: DeadLetter) -> str:
        """The error's last line: for a traceback, the exception and its message."""
        lines = [line for line in (obj.last_error or "").strip().splitlines() if line.strip()]
        last = lines[-1].strip() if lines else ""
        return last if len(last) <= 100 else last[:99] + "…"

    @admin.display(description="error (full)")
    def error_full(self, obj: DeadLetter) -> str:
        return error_html(obj.last_error, show_error=True)

    @admin.display(description="error (full)")
    def error_hidden(self, obj: DeadLetter) -> str:
        return error_html(obj.last_error, show_error=False)

    @admin.display(description="payload")
    def payload_with_data(self, obj: DeadLetter) -> str:
        return payload_html(obj.payload, show_data=True)

    @admin.display(description="payload")
    def payload_without_data(self, obj: DeadLetter) -> str:
        return payload_html(obj.payload, show_data=False)

    def _fields_for(self, request: HttpRequest) -> tuple[str, ...]:
        # Chosen per request (admin instances are shared by the server's threads).
        if _sees_data(request):
            chosen = {"payload": "payload_with_data", "error": "error_full"}
        else:
            chosen = {"payload": "payload_without_data", "error": "error_hidden"}
        return tuple(chosen.get(name, name) for name in self.fields)

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        if _sees_data(request):
            return tuple(self.list_display)
        return tuple(name for name in self.list_display if name not in self.TEXT_FIELDS)

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        if _sees_data(request):
            return tuple(self.search_fields)
        return tuple(name for name in self.search_fields if name not in self.TEXT_FIELDS)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self._fields_for(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self._fields_for(request)

    def _check_lookups(self, request: HttpRequest) -> None:
        if _sees_data(request):
            return
        columns = {field.name for field in self.model._meta.get_fields()}
        for key in request.GET:
            column = key.split("__", 1)[0]
            if column in columns and column not in self.METADATA_FIELDS:
                raise PermissionDenied(
                    f"filtering on {column} needs the permission "
                    f"{APP_LABEL}.{permissions.VIEW_PAYLOAD}"
                )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._check_lookups(request)
        query = request.GET.copy()
        for key in ("o", "p", "e"):
            query.pop(key, None)
        extra = {
            "can_replay": permissions.has(request.user, permissions.REPLAY_DEAD_LETTERS),
            "can_discard": permissions.has(request.user, permissions.DISCARD_DEAD_LETTERS),
            "bulk_query": query.urlencode(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=extra)

    def get_urls(self) -> list[Any]:
        site = self.admin_site

        def bulk(action: str) -> Any:
            def view(request: HttpRequest) -> HttpResponse:
                self.check_view(request)
                return views.bulk_dead_letters(site, request, action)

            return site.admin_view(view)

        return [
            path("bulk/replay/", bulk("replay"), name=f"{APP_LABEL}_deadletter_bulk_replay"),
            path("bulk/discard/", bulk("discard"), name=f"{APP_LABEL}_deadletter_bulk_discard"),
            *super().get_urls(),
        ]


@admin.register(Operation)
class OperationAdmin(_ReadOnly):
    list_display = (
        "id",
        "kind",
        "actor",
        "started_at",
        "finished_at",
        "filter_text",
        "matched",
        "done",
        "failed",
        "outcome",
    )
    list_filter = ("kind", "outcome", "actor")
    search_fields = ("actor", "detail")
    show_full_result_count = False
    fields = (
        "id",
        "kind",
        "actor",
        "outcome",
        "started_at",
        "finished_at",
        "filter_text",
        "matched",
        "done",
        "failed",
        "last_id",
        "detail",
    )
    readonly_fields = fields

    @admin.display(description="filter")
    def filter_text(self, obj: Operation) -> str:
        shown = {key: value for key, value in (obj.filter or {}).items() if value is not None}
        return " ".join(f"{key}={value}" for key, value in shown.items()) or "everything"


@admin.register(Queue)
class QueueAdmin(_ReadOnly):
    """The queues page replaces the change list: there is no table to list."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self.check_view(request)
        return views.queues_page(self.admin_site, request)

    def get_urls(self) -> list[Any]:
        site = self.admin_site

        def pause(action: str) -> Any:
            def view(request: HttpRequest) -> HttpResponse:
                self.check_view(request)
                return views.queue_pause(site, request, action)

            return site.admin_view(view)

        def cancel(request: HttpRequest) -> HttpResponse:
            self.check_view(request)
            return views.cancel_jobs(site, request)

        def find(request: HttpRequest) -> HttpResponse:
            from platform_tasks.contrib.django.job_search import job_search

            self.check_view(request)
            return job_search(site, request)

        return [
            path("pause/", pause("pause"), name=f"{APP_LABEL}_queue_pause"),
            path("resume/", pause("resume"), name=f"{APP_LABEL}_queue_resume"),
            path("cancel/", site.admin_view(cancel), name=f"{APP_LABEL}_queue_cancel"),
            path("jobs/", site.admin_view(find), name=f"{APP_LABEL}_queue_jobs"),
            path("", site.admin_view(self.changelist_view), name=f"{APP_LABEL}_queue_changelist"),
        ]


@admin.register(Batch)
class BatchAdmin(_ReadOnly):
    """The batches pages replace the change list and the change form: counts come from
    the read model (:mod:`platform_tasks.contrib.django.batch_pages`), not the row."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self.check_view(request)
        return batch_pages.batches_page(self.admin_site, request)

    def get_urls(self) -> list[Any]:
        site = self.admin_site

        def detail(request: HttpRequest, batch_id: str) -> HttpResponse:
            self.check_view(request)
            return batch_pages.batch_page(site, request, batch_id)

        return [
            path("<str:batch_id>/", site.admin_view(detail), name=f"{APP_LABEL}_batch_detail"),
            path("", site.admin_view(self.changelist_view), name=f"{APP_LABEL}_batch_changelist"),
        ]
