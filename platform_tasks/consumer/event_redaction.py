"""What a PlatformTask's task events carry: no payload data (Flower shows every event).

Celery's worker puts the task's return value (``task-succeeded`` ``result``) and the
exception's repr and traceback (``task-failed``, ``task-retried``) into task events, and
both can carry ``data``: a handler that returns part of its input, an error message
that quotes it. :class:`PlatformRequest`, the worker-side request class of every
PlatformTask (Celery's ``Task.Request``), keeps the result out of events and sends the
exception's type with a message the platform composed: the pipeline's own
:class:`~platform_tasks.errors.DeadLettered` and retry messages (reason, attempt, error
type), or for anything else the type alone. Tracebacks are not sent; the worker log
and the dead-letter row keep them.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import Retry
from celery.worker.request import Request

from platform_tasks.errors import DeadLettered

REDACTED_RESULT = "<not shown: PlatformTask results stay out of task events>"


def event_exception(exc: BaseException | None) -> str:
    """The exception as an event shows it: its type and a message the platform composed."""
    if exc is None:
        return "<unknown error>"
    if isinstance(exc, DeadLettered):
        return f"DeadLettered({str(exc)!r})"
    if isinstance(exc, Retry):
        return f"Retry({exc.message!r})" if exc.message else "Retry()"
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    return f"{name}(<message not shown>)"


class PlatformRequest(Request):
    """Celery's request, with task events that carry no payload data."""

    _platform_error: BaseException | None = None

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        self._platform_error = _unwrap(exc_info.exception)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )

    def on_retry(self, exc_info: Any) -> Any:
        self._platform_error = _unwrap(exc_info.exception)
        return super().on_retry(exc_info)

    def send_event(self, type: str, **fields: Any) -> None:
        if "result" in fields:
            fields["result"] = REDACTED_RESULT
        if "exception" in fields:
            fields["exception"] = event_exception(self._platform_error)
        if "traceback" in fields:
            fields["traceback"] = None
        super().send_event(type, **fields)


def _unwrap(exc: Any) -> BaseException | None:
    inner = getattr(exc, "exc", None) if type(exc).__name__ == "ExceptionWithTraceback" else exc
    return inner if isinstance(inner, BaseException) else None
