"""One rooted exception tree, so callers can catch everything platform-tasks raises.

Each subclass names what went wrong in its docstring; structured fields sit on the
exception so tests and operators do not have to parse messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


class PlatformError(Exception):
    """Base of every error raised by platform-tasks."""


class ConfigurationError(PlatformError):
    """A setting, option or declaration is invalid; raised before any work starts."""


class SettingsError(ConfigurationError):
    """One or more environment settings are invalid.

    ``problems`` holds ``(variable, message)`` pairs, one per bad variable, so the error
    always names the variable the operator has to fix.
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        lines = "; ".join(f"{var}: {msg}" for var, msg in self.problems)
        super().__init__(f"invalid platform settings: {lines}")


class EnvelopeError(PlatformError, ValueError):
    """A job payload is not a valid envelope.

    ``errors`` lists every bad field as ``(field, message)``; a subclass of ``ValueError``
    because it is bad input, not a platform fault.
    """

    def __init__(self, errors: Sequence[tuple[str, str]]) -> None:
        self.errors = list(errors)
        detail = "; ".join(f"{field}: {msg}" for field, msg in self.errors)
        super().__init__(f"invalid envelope: {detail}")


class NaiveDatetimeError(PlatformError, ValueError):
    """A datetime without a timezone was given where an instant is required."""


class ServerStartError(PlatformError):
    """A Redis or PostgreSQL server of the harness could not be started."""


class MigrationError(PlatformError):
    """A schema migration failed or the migration files are inconsistent."""


class UnsafeRedisError(ConfigurationError):
    """The Redis server is configured so that platform keys could be evicted."""


class BrokerPublishError(PlatformError):
    """The connection or channel to RabbitMQ failed while publishing a batch of delayed
    jobs: none of the batch is known to have arrived, so none of it may be removed."""


class PermanentError(PlatformError):
    """Raised by a handler for a failure that retrying cannot fix.

    The job is dead-lettered at once, with no further attempts.
    """


class Throttled(PlatformError):
    """A job may not run now (a rate limit or a provider said "slow down"); run it at ``retry_at``.

    Raised from :meth:`PlatformTask.execute` inside the job's transaction: the transaction
    rolls back, the job is rescheduled through the delay store at ``retry_at`` with the
    same attempt number (no attempt is spent) and it is never dead-lettered for it.
    ``reason`` is a short stable label for logs and metrics (``provider_rate_limit``,
    ``tenant_rate_limit``, ``provider_429``...).
    """

    def __init__(self, retry_at: datetime, reason: str) -> None:
        if retry_at.tzinfo is None or retry_at.utcoffset() is None:
            raise NaiveDatetimeError("Throttled.retry_at must be timezone-aware")
        self.retry_at = retry_at
        self.reason = reason
        super().__init__(f"throttled ({reason}) until {retry_at.isoformat()}")


class DeadLettered(PlatformError):
    """The job was written to ``core.dead_letters``; raised so Celery records a failure.

    Its message is composed by the platform (reason, attempts, error type), never the
    handler's error text, because Celery puts it in task events and Flower shows them.
    ``dead_letter_id`` is the row's id (``None`` when another delivery had written it).
    Listed in ``PlatformTask.throws``: Sentry's Celery integration does not report it a
    second time (the dead-letter alert already did).
    """

    def __init__(self, message: str, dead_letter_id: int | None = None) -> None:
        self.dead_letter_id = dead_letter_id
        super().__init__(message)


class HardTimeLimitExceeded(PlatformError):
    """Celery's pool killed the process running an attempt at the task's hard ``time_limit``.

    The attempt never returned, so the worker's main process records the stop and puts
    the message back; its next delivery settles the stopped attempt with this error: a
    failed attempt, retried by the queue's retry policy and dead-lettered after the last
    one (at once if a task lists it in ``permanent_errors``). Not a subclass of Celery's
    ``TimeLimitExceeded``: this module must not import Celery (the static ``jobs``
    commands load it).
    """

    def __init__(self, seconds: float, attempt: int) -> None:
        self.seconds = seconds
        self.attempt = attempt
        self.message = (
            f"attempt {attempt} was stopped at its hard time limit of {seconds:g}s "
            "(the task's time_limit): the pool killed the process running it"
        )
        super().__init__(self.message)


class ServersUnavailable(PlatformError):
    """PostgreSQL or Redis did not answer (or refused a write); the delivery waits.

    Internal control flow of the consumer: never raised to a handler, never dead-lettered,
    and the message stays unacked while it lasts.
    """


class TransactionBroken(PlatformError):
    """The handler ended, closed or aborted the transaction it was given.

    A failed attempt like any error the handler raises (retried with backoff, within the
    budget): for example a SQL error caught inside the handler, after which PostgreSQL
    answers ``COMMIT`` with ``ROLLBACK``.
    """


class JobDefinitionError(ConfigurationError):
    """A scheduled job file or definition is invalid (bad cron, unknown zone, duplicate name...).

    ``file`` is the job file (``None`` when a definition is built outside discovery) and
    ``field`` the ``define_job`` argument at fault (``None`` for file-level problems such
    as a file defining no job), so the operator knows exactly what to edit.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.detail = message
        where = ", ".join(
            part
            for part in (f"file {file}" if file else "", f"field {field!r}" if field else "")
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class JobStartupError(ConfigurationError):
    """Scheduled jobs cannot start: Redis unreachable or unsafe while jobs are active."""


class ReplayError(PlatformError):
    """Publishing a dead letter during replay failed.

    ``dead_letter_id`` is the row that could not be published; it stays ``pending_review``.
    ``replayed`` lists the ids published and marked ``replayed`` before the failure.
    """

    def __init__(self, dead_letter_id: int, replayed: Sequence[int], cause: BaseException) -> None:
        self.dead_letter_id = dead_letter_id
        self.replayed = list(replayed)
        super().__init__(
            f"publishing dead letter {dead_letter_id} failed ({type(cause).__name__}: {cause}); "
            f"it stays pending_review; {len(self.replayed)} row(s) were replayed before it"
        )


class OutputRefused(PermanentError):
    """A handler returned a value that cannot be recorded as the job's output: not JSON, or
    larger than ``PLATFORM_JOB_OUTPUT_MAX_BYTES``. Permanent: the same handler returns the
    same value again, so the job is dead-lettered at once (its work rolled back with it)
    and can be replayed once the handler or the setting changed."""
