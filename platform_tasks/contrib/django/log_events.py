"""Every console log line carries an ``event`` key, Django's and waitress's included."""

from __future__ import annotations

import logging

__all__ = ["EventFilter", "RoutineRefusals"]


class EventFilter(logging.Filter):
    """Gives a record without ``event`` one derived from its logger (``django.request``
    → ``django.request``), so the line format can always print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "event"):
            record.event = record.name
        return True


class RoutineRefusals(logging.Filter):
    """Keeps Django's ``Forbidden`` lines but drops their traceback: a refused action is
    routine (``console.action_refused`` says who and what), not a crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "django.request" and getattr(record, "status_code", None) == 403:
            record.exc_info = None
            record.exc_text = None
        return True
