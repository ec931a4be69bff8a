"""Every console log line carries an ``event`` key, Django's and waitress's included."""

from __future__ import annotations

import logging

__all__ = ["EventFilter"]


class EventFilter(logging.Filter):
    """Gives a record without ``event`` one derived from its logger (``django.request``
    → ``django.request``), so the line format can always print it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "event"):
            record.event = record.name
        return True
