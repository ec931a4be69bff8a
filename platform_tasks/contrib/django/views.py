"""The console's action pages: a confirmation page (GET, read-only: the preview) and the
action itself (POST only, CSRF-checked by the admin, permission-checked here).

Every action runs through :mod:`platform_tasks.operations` with the logged-in user as
the actor, so each one is a ``core.operations`` row; after it, the browser is sent to
that row. A user without the action's permission gets 403 on POST whatever the form
holds (the pages show no action button to them in the first place).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse

from platform_tasks import operations
from platform_tasks.contrib.django import permissions
from platform_tasks.contrib.django.apps import APP_LABEL
from platform_tasks.contrib.django.filters import FilterRefused, bulk_filter
from platform_tasks.contrib.django.platform import platform_settings, safe_error

__all__ = ["bulk_dead_letters", "cancel_jobs", "queue_pause"]

logger = logging.getLogger("platform_tasks.contrib.django.views")

BULK_ACTIONS = {
    "replay": permissions.REPLAY_DEAD_LETTERS,
    "discard": permissions.DISCARD_DEAD_LETTERS,
}
SAMPLE_SIZE = 20
REFUSED_SHOWN = 5
"""Rows a replay refused, named in the message after it (the log row counts them all)."""
FILTER_FORM_FIELDS = ("queue", "kind", "tenant_id", "error_type", "since", "until")


def _require(request: HttpRequest, codename: str) -> None:
    if not permissions.has(request.user, codename):
        logger.warning(
            "refused %s %s by %s: no permission %s.%s",
            request.method,
            request.path,
            request.user.get_username(),
            APP_LABEL,
            codename,
            extra={"event": "console.action_refused", "actor": request.user.get_username()},
        )
        raise PermissionDenied(f"needs the permission {APP_LABEL}.{codename}")


def _operation_url(operation_id: int) -> str:
    return str(reverse(f"admin:{APP_LABEL}_operation_change", args=[operation_id]))


def _context(admin_site: Any, request: HttpRequest, **values: Any) -> dict[str, Any]:
    return {**admin_site.each_context(request), **values}


def _form_filter(data: Mapping[str, str]) -> operations.OperationFilter:
    values = {key: data.get(key, "") for key in FILTER_FORM_FIELDS}
    query = {
        **{k: v for k, v in values.items() if k not in ("since", "until")},
        "created_at__gte": values["since"],
        "created_at__lt": values["until"],
    }
    return bulk_filter(query)


def bulk_dead_letters(admin_site: Any, request: HttpRequest, action: str) -> HttpResponse:
    """``replay`` or ``discard`` every pending dead letter matching a filter.

    GET (from the list's "… all matching" button, the list's query string) shows the
    preview: how many rows, the first :data:`SAMPLE_SIZE`. POST (the confirmation form,
    its fields the filter) runs the operation."""
    codename = BULK_ACTIONS[action]
    if request.method == "POST":
        _require(request, codename)
        return _run_bulk(request, action)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    context = _context(
        admin_site,
        request,
        title=f"{action.capitalize()} dead letters",
        action=action,
        can_act=permissions.has(request.user, codename),
        # the error text is customer data (a database error quotes the refused value)
        show_errors=permissions.has(request.user, permissions.VIEW_PAYLOAD),
        changelist_query=request.GET.urlencode(),
    )
    try:
        where = bulk_filter(request.GET)
        preview = operations.preview_dead_letters(
            platform_settings(), where, sample_size=SAMPLE_SIZE
        )
    except FilterRefused as exc:
        context["refusal"] = str(exc)
    except Exception as exc:
        context["refusal"] = f"the preview failed: {safe_error(exc)}"
    else:
        form = where.to_json()
        context.update(
            where=where,
            preview=preview,
            form=form,
            everything=where.is_empty,
            more=preview.matched - len(preview.sample),
        )
    return TemplateResponse(request, "platform_console/bulk_confirm.html", context)


def _run_bulk(request: HttpRequest, action: str) -> HttpResponse:
    actor = request.user.get_username()
    back = reverse(f"admin:{APP_LABEL}_deadletter_changelist")
    try:
        where = _form_filter(request.POST)
    except FilterRefused as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    if where.is_empty and request.POST.get("everything") != "yes":
        messages.error(
            request,
            "an empty filter means every pending dead letter: tick the "
            "confirmation box to act on all of them",
        )
        return HttpResponseRedirect(back)
    settings = platform_settings()
    try:
        if action == "replay":
            result = operations.bulk_replay(
                settings, where, actor=actor, allow_empty_filter=where.is_empty
            )
        else:
            reason = (request.POST.get("reason") or "").strip()
            if not reason:
                messages.error(request, "a discard needs a reason (the field 'reason')")
                return HttpResponseRedirect(back)
            result = operations.bulk_discard(
                settings, where, reason=reason, actor=actor, allow_empty_filter=where.is_empty
            )
    except Exception as exc:
        logger.error(
            "bulk %s by %s (%s) failed: %s",
            action,
            actor,
            where.describe(),
            safe_error(exc),
            extra={"event": f"console.bulk_{action}_failed"},
        )
        messages.error(request, f"the {action} failed: {safe_error(exc)}")
        return HttpResponseRedirect(back)
    _report_bulk(request, action, actor, where, result)
    return HttpResponseRedirect(_operation_url(result.operation.id))


def _report_bulk(
    request: HttpRequest,
    action: str,
    actor: str,
    where: operations.OperationFilter,
    result: operations.BulkResult,
) -> None:
    """Log the finished operation and tell the user its outcome, including the rows left
    pending (the first :data:`REFUSED_SHOWN`, so one bad batch cannot flood the page)."""
    op = result.operation
    logger.info(
        "bulk %s by %s (%s): operation %d %s, %d of %d done, %d failed",
        action,
        actor,
        where.describe(),
        op.id,
        op.outcome,
        op.done,
        op.matched,
        op.failed,
        extra={"event": f"console.bulk_{action}", "operation_id": op.id},
    )
    messages.success(
        request,
        f"{action} operation {op.id}: {op.outcome}, {op.done} of "
        f"{op.matched} done, {op.failed} failed"
        + (" (continued an unfinished run)" if result.resumed else ""),
    )
    if result.refused:
        shown = "; ".join(f"id {row_id}: {why}" for row_id, why in result.refused[:REFUSED_SHOWN])
        more = len(result.refused) - REFUSED_SHOWN
        messages.warning(
            request,
            f"{len(result.refused)} rows were left pending: {shown}"
            + (f" (and {more} more)" if more > 0 else ""),
        )


def queue_pause(admin_site: Any, request: HttpRequest, action: str) -> HttpResponse:
    """``pause`` or ``resume`` one queue (``?queue=`` / the form's ``queue``)."""
    source = request.POST if request.method == "POST" else request.GET
    queue = (source.get("queue") or "").strip()
    back = reverse(f"admin:{APP_LABEL}_queue_changelist")
    if request.method == "POST":
        _require(request, permissions.PAUSE_QUEUES)
        if not queue:
            messages.error(request, "no queue named (the field 'queue')")
            return HttpResponseRedirect(back)
        run: Callable[..., Any] = (
            operations.pause_queue if action == "pause" else operations.resume_queue
        )
        actor = request.user.get_username()
        try:
            op = run(platform_settings(), queue, actor=actor)
        except Exception as exc:
            messages.error(request, f"the {action} of {queue} failed: {safe_error(exc)}")
            return HttpResponseRedirect(back)
        logger.info(
            "%s of queue %s by %s: operation %d",
            action,
            queue,
            actor,
            op.id,
            extra={"event": f"console.queue_{action}", "operation_id": op.id},
        )
        note = f" ({op.detail})" if op.detail else ""
        messages.success(request, f"{action} of queue {queue}: operation {op.id}{note}")
        return HttpResponseRedirect(_operation_url(op.id))
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    context = _context(
        admin_site,
        request,
        title=f"{action.capitalize()} queue {queue}",
        action=action,
        queue=queue,
        can_act=permissions.has(request.user, permissions.PAUSE_QUEUES),
    )
    try:
        statuses = operations.queue_overview(platform_settings(), [queue]) if queue else []
    except Exception as exc:
        context["refusal"] = f"the queue could not be read: {safe_error(exc)}"
    else:
        context["status"] = statuses[0] if statuses else None
        if not queue:
            context["refusal"] = "no queue named (the parameter 'queue')"
    return TemplateResponse(request, "platform_console/queue_confirm.html", context)


def cancel_jobs(admin_site: Any, request: HttpRequest) -> HttpResponse:
    """Cancel the waiting jobs of a tenant / kind / queue. GET with no filter: the form;
    GET with one: the preview and the confirmation; POST: the cancel."""
    source = request.POST if request.method == "POST" else request.GET
    values = {
        key: (source.get(key) or "").strip() or None for key in ("tenant_id", "kind", "queue")
    }
    if request.method == "POST":
        _require(request, permissions.CANCEL_JOBS)
        back = reverse(f"admin:{APP_LABEL}_queue_cancel")
        actor = request.user.get_username()
        try:
            where = operations.JobFilter(**values)
            result = operations.cancel_jobs(platform_settings(), where, actor=actor)
        except Exception as exc:
            messages.error(request, f"the cancel failed: {safe_error(exc)}")
            return HttpResponseRedirect(back)
        op = result.operation
        logger.info(
            "cancel of %s by %s: operation %d, %d delayed jobs cancelled",
            where.describe(),
            actor,
            op.id,
            result.delayed_cancelled,
            extra={"event": "console.cancel", "operation_id": op.id},
        )
        messages.success(
            request,
            f"cancel operation {op.id}: {result.delayed_cancelled} delayed "
            "jobs cancelled; queued ones are cancelled as they come up",
        )
        return HttpResponseRedirect(_operation_url(op.id))
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    context = _context(
        admin_site,
        request,
        title="Cancel waiting jobs",
        form=values,
        can_act=permissions.has(request.user, permissions.CANCEL_JOBS),
    )
    if any(values.values()):
        try:
            where = operations.JobFilter(**values)
            context["preview"] = operations.preview_cancel(platform_settings(), where)
            context["where"] = where
        except Exception as exc:
            context["refusal"] = safe_error(exc)
    return TemplateResponse(request, "platform_console/cancel_confirm.html", context)


def shown_queues(paused: list[operations.PausedQueue]) -> list[str]:
    """The queues page lists ``default``, every paused queue and the queues named in
    ``PLATFORM_CONSOLE_QUEUES`` (comma-separated: the console has no Celery app to
    learn them from)."""
    configured = os.environ.get("PLATFORM_CONSOLE_QUEUES", "")
    names = {"default", *(p.queue for p in paused)}
    names.update(name.strip() for name in configured.split(",") if name.strip())
    return sorted(names)


def queues_page(admin_site: Any, request: HttpRequest) -> HttpResponse:
    """Queue depths, paused queues and the cancels in force (read-only)."""
    context = _context(
        admin_site,
        request,
        title="Queues",
        can_pause=permissions.has(request.user, permissions.PAUSE_QUEUES),
        can_cancel=permissions.has(request.user, permissions.CANCEL_JOBS),
    )
    settings = platform_settings()
    try:
        names = shown_queues(operations.paused_queues(settings))
        context["queues"] = operations.queue_overview(settings, names)
    except Exception as exc:
        context["queues_error"] = safe_error(exc)
    try:
        context["cancels"] = operations.cancel_rules(settings)
    except Exception as exc:
        context["cancels_error"] = safe_error(exc)
    return TemplateResponse(request, "platform_console/queues.html", context)
