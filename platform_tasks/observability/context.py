"""The job currently running in this thread, for correlation ids that follow the work.

A job published from inside another job inherits its correlation id, so one request's
whole trail of jobs can be found with one id.
"""

from __future__ import annotations

from contextvars import ContextVar

current_correlation_id: ContextVar[str | None] = ContextVar(
    "platform_current_correlation_id", default=None
)
