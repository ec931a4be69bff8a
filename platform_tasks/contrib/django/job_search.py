"""The console's job search: a job id or a correlation id in, the state(s) out.

A job id is answered by :func:`platform_tasks.jobs_status.job_status`; a correlation id
(or a job id no store knows, which may be a correlation id written as a UUID) by
:func:`~platform_tasks.jobs_status.jobs_of_correlation`. Every viewer of the queues page
sees states and their details; a job's recorded output is shown only to users with the
payload permission (``view_dead_letter_payload``), like a dead letter's data. One
:class:`~platform_tasks.jobs_status.StatusReader` per process is kept between requests
(its connections), guarded by a lock: the console serves a few operators, not traffic.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from platform_tasks.contrib.django import permissions
from platform_tasks.contrib.django.platform import platform_settings, safe_error
from platform_tasks.jobs_status import JobStatus, StatusReader

__all__ = ["job_search"]

logger = logging.getLogger("platform_tasks.contrib.django.job_search")

_lock = threading.Lock()
_reader: StatusReader | None = None


def _answer(text: str) -> list[JobStatus]:
    global _reader
    with _lock:
        if _reader is None:
            _reader = StatusReader(platform_settings(), queues=_queues())
        try:
            return _lookup(_reader, text)
        except Exception:
            _reader.close()  # connections in an unknown state: opened again next time
            raise


def _lookup(reader: StatusReader, text: str) -> list[JobStatus]:
    try:
        uuid.UUID(text)
    except ValueError:
        return reader.correlation(text)
    status = reader.job(text)
    if status.state != "unknown":
        return [status]
    return reader.correlation(text) or [status]


def _queues() -> list[str]:
    configured = os.environ.get("PLATFORM_CONSOLE_QUEUES", "")
    return [name.strip() for name in configured.split(",") if name.strip()]


def _row(status: JobStatus, *, with_output: bool) -> dict[str, Any]:
    details = status.details
    progress = details.get("progress") if status.state == "running" else None
    return {
        "job_id": status.job_id,
        "state": status.state,
        "summary": status.summary(),
        "details": json.dumps(details, indent=2, default=str),
        "progress": progress,
        "output": (
            json.dumps(status.output, indent=2, default=str)
            if with_output and status.output is not None
            else None
        ),
        "output_hidden": not with_output and status.output is not None,
    }


def job_search(admin_site: Any, request: HttpRequest) -> HttpResponse:
    """GET ``?q=`` a job id or a correlation id: the state of each job found."""
    text = (request.GET.get("q") or "").strip()
    with_output = permissions.has(request.user, permissions.VIEW_PAYLOAD)
    context: dict[str, Any] = {
        **admin_site.each_context(request),
        "title": "Find a job",
        "q": text,
        "rows": None,
    }
    if text:
        try:
            statuses = _answer(text)
            context["rows"] = [_row(s, with_output=with_output) for s in statuses]
        except Exception as exc:
            logger.warning(
                "job search failed: %s",
                safe_error(exc),
                extra={"event": "console.job_search_failed"},
            )
            context["search_error"] = safe_error(exc)
    return TemplateResponse(request, "platform_console/job_search.html", context)
