"""Alerts for operators: dead letters, poison messages and dropped messages.

Alerts go to Sentry when ``SENTRY_DSN`` is set and are logged either way, so a deployment
without Sentry still sees them in its log pipeline. Every alert carries a ``fingerprint``
(e.g. queue + kind + error type) so a storm of one failure groups into one Sentry issue
instead of thousands.

Sentry is initialised once per process by :func:`configure_alerts` (the consumer installs
it for workers); :func:`send_alert` never raises, because an alert that fails must not turn
a handled failure into a lost message.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

_lock = threading.Lock()
_configured_dsn: str | None = None
_configured_pid: int | None = None


def configure_alerts(dsn: str | None) -> bool:
    """Initialise sentry-sdk for this process when ``dsn`` is set; return whether it is on.

    Safe to call more than once and after a fork: a pool child re-initialises, because the
    SDK's transport thread does not survive ``fork``.
    """
    global _configured_dsn, _configured_pid
    if not dsn:
        return False
    with _lock:
        if _configured_dsn == dsn and _configured_pid == os.getpid():
            return True
        import sentry_sdk

        # Local variables of the failing frames hold the envelope and its data: payload
        # data must not leave the process unless a task opts in, so they are not sent.
        sentry_sdk.init(
            dsn=dsn,
            default_integrations=False,
            send_default_pii=False,
            include_local_variables=False,
        )
        _configured_dsn = dsn
        _configured_pid = os.getpid()
        return True


def _sentry_enabled() -> bool:
    dsn = _configured_dsn or os.environ.get("SENTRY_DSN")
    return configure_alerts(dsn)


def send_alert(
    message: str,
    *,
    tags: Mapping[str, str | None],
    fingerprint: Sequence[str],
    level: str = "error",
    exc: BaseException | None = None,
) -> None:
    """Report ``message`` to Sentry (when configured) and to the log; never raises.

    ``tags`` with a ``None`` value are left out of Sentry (it rejects them) but logged.
    ``fingerprint`` decides grouping; pass the few fields that identify *the same* problem.
    """
    clean_tags = {key: str(value) for key, value in tags.items() if value is not None}
    log_level = _LEVELS.get(level, logging.ERROR)
    logger.log(
        log_level,
        "alert: %s",
        message,
        extra={"event": "alert.sent", "alert_tags": clean_tags, "fingerprint": list(fingerprint)},
    )
    try:
        if not _sentry_enabled():
            return
        _capture(message, clean_tags, list(fingerprint), level, exc)
    except Exception:  # an alert must never break the failure path that raised it
        logger.exception("alert could not be sent to Sentry", extra={"event": "alert.failed"})


def _capture(
    message: str,
    tags: dict[str, str],
    fingerprint: list[str],
    level: str,
    exc: BaseException | None,
) -> None:
    import sentry_sdk

    with sentry_sdk.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        scope.fingerprint = fingerprint
        scope.set_level(level)  # type: ignore[arg-type]
        if exc is not None:
            scope.set_extra("alert_message", message)
            sentry_sdk.capture_exception(exc)
        else:
            sentry_sdk.capture_message(message, level=level)  # type: ignore[arg-type]


def flush_alerts(timeout: float = 2.0) -> None:
    """Wait for queued Sentry events (worker shutdown); a no-op without Sentry."""
    if _configured_dsn is None:
        return
    import sentry_sdk

    sentry_sdk.flush(timeout=timeout)
