"""Alerts for operators: dead letters, poison messages, dropped messages, failed jobs.

Alerts go to Sentry when Sentry is on and are logged either way, so a deployment without
Sentry still sees them in its log pipeline. Every alert carries a ``fingerprint`` (e.g.
queue + kind + error type) so a storm of one failure groups into one Sentry issue instead
of thousands.

The platform is a library inside someone's application, so it uses Sentry the way a
library should:

* when the application already initialised sentry-sdk, its client is used as it is (its
  DSN, its options); the platform never calls ``sentry_sdk.init`` over it;
* only when no client is active and ``SENTRY_DSN`` is set does the platform initialise
  one itself (no default integrations, no local variables);
* one problem is one event: the alert logger is ignored by Sentry's logging integration,
  and a log line the platform writes next to a problem it reports itself (its ``event``
  is in :data:`REPORTED_LOG_EVENTS`) is not turned into a second event;
* the platform's own events never carry the local variables of frames (they hold the
  envelope and its data), whatever the application configured.

:func:`send_alert` never raises, because an alert that fails must not turn a handled
failure into a lost message.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ALERT_LOGGER",
    "REPORTED_LOG_EVENTS",
    "configure_alerts",
    "flush_alerts",
    "private_data_options",
    "report_exception",
    "sdk_major",
    "send_alert",
    "sentry_enabled",
]

ALERT_LOGGER = "platform_tasks.alerts"
"""The logger every alert is written to; Sentry's logging integration ignores it."""

REPORTED_LOG_EVENTS = frozenset(
    {"consumer.dead_lettered", "consumer.dropped_message_dead_lettered", "jobs.run_failed"}
)
"""``event`` values of platform log lines written next to a problem the platform reports
to Sentry itself (as an alert); Sentry's logging integration must not report them again."""

logger = logging.getLogger(ALERT_LOGGER)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

_lock = threading.Lock()
_hooks_installed = False
_init_failed = False


def _install_hooks() -> None:
    """Register, once per process, what keeps one problem to one event."""
    global _hooks_installed
    if _hooks_installed:
        return
    from sentry_sdk.integrations.logging import ignore_logger
    from sentry_sdk.scope import add_global_event_processor

    ignore_logger(ALERT_LOGGER)
    add_global_event_processor(_drop_reported_log_events)
    _hooks_installed = True


def _drop_reported_log_events(event: Any, hint: Any) -> Any:
    """Drop the logging integration's event for a log line of an already reported problem."""
    record = hint.get("log_record") if isinstance(hint, Mapping) else None
    if (
        record is not None
        and record.name.startswith("platform_tasks")
        and getattr(record, "event", None) in REPORTED_LOG_EVENTS
    ):
        return None
    return event


def configure_alerts(dsn: str | None) -> bool:
    """Make Sentry usable for the platform; return whether it is on. Never raises.

    An active client (the application's, or one made here before) is used as it is.
    Otherwise a client is initialised from ``dsn`` when it is set. Safe to call often and
    after a fork (the SDK restarts its transport thread in the child by itself).

    A Sentry that cannot be set up (an SDK release whose options changed, a broken
    install) turns alerts into log lines only: it is logged once per process as
    ``alert.sink_unavailable`` and never reaches the delivery that asked, because an alert
    sink must not stop a dead-letter write or end a delivery without its verdict.
    """
    global _init_failed
    with _lock:
        if _init_failed:
            return False
        try:
            import sentry_sdk

            if sentry_sdk.get_client().is_active():
                _install_hooks()
                return True
            if not dsn:
                return False
            from sentry_sdk.integrations.atexit import AtexitIntegration

            _install_hooks()
            # The only integration: send what is queued when a command exits (quietly).
            sentry_sdk.init(
                dsn=dsn,
                default_integrations=False,
                integrations=[AtexitIntegration(callback=_quiet_exit)],
                **private_data_options(sdk_major(sentry_sdk.VERSION)),
            )
            return True
        except Exception as exc:
            _init_failed = True
            logger.error(
                "Sentry could not be set up (%s: %s); alerts are logged only",
                type(exc).__name__,
                exc,
                extra={"event": "alert.sink_unavailable", "sink": "sentry"},
            )
            return False


def sdk_major(version: str) -> int:
    """The major release of sentry-sdk from its ``VERSION`` string (``"3.0.0"`` → 3)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def private_data_options(major: int) -> dict[str, Any]:
    """``sentry_sdk.init`` options that keep personal data and frame variables out.

    Local variables of the failing frames hold the envelope and its data: payload data
    must not leave the process unless a task opts in, so they are not sent. sentry-sdk 2
    names this ``send_default_pii`` / ``include_local_variables``; 3 replaced both with
    ``data_collection`` and refuses the old names ("Unknown option").
    """
    if major >= 3:
        return {"data_collection": {"user_info": False, "stack_frame_variables": False}}
    return {"send_default_pii": False, "include_local_variables": False}


def _quiet_exit(pending: int, timeout: float) -> None:
    """Flush at exit without the SDK's message on stderr (it is not ours to print)."""


def sentry_enabled() -> bool:
    """Whether Sentry is on: a client is active, or ``SENTRY_DSN`` lets one be made."""
    return configure_alerts(os.environ.get("SENTRY_DSN"))


def send_alert(
    message: str,
    *,
    tags: Mapping[str, str | None],
    fingerprint: Sequence[str],
    level: str = "error",
    exc: BaseException | None = None,
) -> None:
    """Report ``message`` to Sentry (when on) and to the log; never raises.

    ``tags`` with a ``None`` value are left out of Sentry (it rejects them) but logged.
    ``fingerprint`` decides grouping; pass the few fields that identify *the same* problem.
    """
    clean_tags = {key: str(value) for key, value in tags.items() if value is not None}
    try:
        enabled = sentry_enabled()  # first: the hooks must be in place before we log
    except Exception:
        enabled = False
        logger.exception("Sentry could not be initialised", extra={"event": "alert.failed"})
    logger.log(
        _LEVELS.get(level, logging.ERROR),
        "alert: %s",
        message,
        extra={"event": "alert.sent", "alert_tags": clean_tags, "fingerprint": list(fingerprint)},
    )
    if enabled:
        _capture(message, clean_tags, list(fingerprint), level, exc)


def report_exception(
    exc: BaseException, *, message: str, tags: Mapping[str, str], fingerprint: Sequence[str]
) -> None:
    """Send ``exc`` to Sentry (when on) without logging it; never raises.

    For a failure the caller has already logged (with its own ``event``, listed in
    :data:`REPORTED_LOG_EVENTS`), so it reaches Sentry once and the log once.
    """
    try:
        enabled = sentry_enabled()
    except Exception:
        logger.exception("Sentry could not be initialised", extra={"event": "alert.failed"})
        return
    if enabled:
        _capture(message, dict(tags), list(fingerprint), "error", exc)


def _strip_local_variables(event: Any, hint: Any) -> Any:
    """Remove frame ``vars`` from a platform event, even if the client would send them."""
    exceptions = event.get("exception", {}).get("values", [])
    threads = event.get("threads", {}).get("values", [])
    for holder in (*exceptions, *threads):
        for frame in (holder.get("stacktrace") or {}).get("frames", []):
            frame.pop("vars", None)
    return event


def _capture(
    message: str,
    tags: dict[str, str],
    fingerprint: list[str],
    level: str,
    exc: BaseException | None,
) -> None:
    try:
        import sentry_sdk

        with sentry_sdk.new_scope() as scope:
            for key, value in tags.items():
                scope.set_tag(key, value)
            scope.fingerprint = fingerprint
            scope.set_level(level)  # type: ignore[arg-type]
            scope.add_event_processor(_strip_local_variables)
            if exc is not None:
                scope.set_extra("alert_message", message)
                sentry_sdk.capture_exception(exc)
            else:
                sentry_sdk.capture_message(message, level=level)  # type: ignore[arg-type]
    except Exception:  # an alert must never break the failure path that raised it
        logger.exception("alert could not be sent to Sentry", extra={"event": "alert.failed"})


def flush_alerts(timeout: float = 2.0) -> None:
    """Wait for queued Sentry events (worker shutdown); a no-op without Sentry."""
    if not _hooks_installed:
        return
    try:
        import sentry_sdk

        if sentry_sdk.get_client().is_active():
            sentry_sdk.flush(timeout=timeout)
    except Exception:  # shutting down: a sink that fails must not stop the rest of it
        logger.exception("queued alerts could not be flushed", extra={"event": "alert.failed"})
