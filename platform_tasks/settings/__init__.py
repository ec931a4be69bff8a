"""Platform settings, read once from the environment and passed explicitly from there on.

Everything that configures platform-tasks goes through :class:`PlatformSettings` so an
operator sees one documented list of variables and a bad value fails at start-up with the
variable's name, instead of deep inside a worker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from platform_tasks.errors import SettingsError
from platform_tasks.settings.provider_urls import check_base_url
from platform_tasks.settings.rate_limits import RateLimit, parse_rate_limits
from platform_tasks.settings.tenant_weights import parse_tenant_weights
from platform_tasks.settings.tenants_query import single_statement

ENV_PREFIX = "PLATFORM_"
SECRET_MASK = "***"

_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|passfile|sslpassword)=)[^&#]*")
_HOST = re.compile(r"^(?:[A-Za-z0-9_.\-]+|[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.\-]+)?)$")
_LIBPQ_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
    "load_balance_hosts": ("disable", "random"),
}
_LIBPQ_INTEGERS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def redact_url(url: str) -> str:
    """``url`` with its password (and any ``password=`` query value) replaced by ``***``.

    For every URL an operator may see: settings errors, logs, ``dev`` output, CLI errors.
    Works on malformed URLs too (everything between the user name and the last ``@``
    is masked), since a malformed URL is exactly the one an error message shows.
    """
    text = _QUERY_SECRET.sub(lambda m: m[1] + SECRET_MASK, url)
    scheme, sep, rest = text.partition("://")
    if not sep:  # no scheme: "user:password@host" still carries a password
        scheme, rest = "", text
    if "@" not in rest:
        return text
    credentials, _, host = rest.rpartition("@")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}{sep}{user}{colon}{SECRET_MASK if colon else ''}@{host}"


def url_password(url: str) -> str | None:
    """The password a URL carries (in its user info or query), as written."""
    match = _QUERY_SECRET.search(url)
    if match:
        return url[match.end(1) : match.end()] or None
    _, sep, rest = url.partition("://")
    credentials, at, _ = (rest if sep else url).rpartition("@")
    if not at or ":" not in credentials:
        return None
    return credentials.partition(":")[2] or None


def without_secrets(text: str, *urls: str | None) -> str:
    """``text`` (e.g. a driver's error message) with each URL and its password masked."""
    from urllib.parse import unquote

    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact_url(url))
        password = url_password(url)
        if password:
            for secret in {password, unquote(password)}:
                if len(secret) >= 1:
                    text = text.replace(secret, SECRET_MASK)
    return text


def postgres_url_problem(url: str) -> str | None:
    """Why libpq would refuse ``url`` (unknown option, bad port, bad host), or ``None``.

    ``parse_dsn`` applies libpq's own URI rules; ports, hosts and enumerated options are
    checked here because libpq only checks them when connecting, where a worker would
    find out per job. The reason never contains the password.
    """
    from psycopg2 import ProgrammingError
    from psycopg2.extensions import parse_dsn

    try:
        options = parse_dsn(url)
    except ProgrammingError as exc:
        reason = str(exc).strip().removeprefix("invalid dsn: ")
        return f"libpq cannot parse it: {without_secrets(reason, url)}"
    problem = _option_problem(options)
    if problem is None:
        return None
    secret = options.get("password")
    if secret:
        problem = problem.replace(secret, SECRET_MASK)
    return without_secrets(problem, url)


def _option_problem(options: Mapping[str, str]) -> str | None:
    for host in (options.get("host") or "").split(","):
        if "@" in host:
            return "its host contains '@' (write an @ in the user or password as %40)"
        if host and not host.startswith("/") and not _HOST.match(host):
            return f"host {host!r} is not a host name, an IP address or a socket directory"
    for port in (options.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"port {port!r} is not a number from 1 to 65535"
    for name, choices in _LIBPQ_CHOICES.items():
        if name in options and options[name] not in choices:
            return f"{name}={options[name]!r} is not one of {', '.join(choices)}"
    for name in _LIBPQ_INTEGERS:
        if name in options and not options[name].lstrip("-").isdigit():
            return f"{name}={options[name]!r} is not an integer"
    return None


_CHANNEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _split_globs(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class PlatformSettings(BaseSettings):
    """Every platform setting, each one an environment variable ``PLATFORM_<NAME>``.

    ``sentry_dsn`` is the exception: it reads the conventional ``SENTRY_DSN``.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        frozen=True,
        populate_by_name=True,
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None
    database_url: str | None = None
    profile: str = "development"
    sentry_dsn: str | None = Field(default=None, validation_alias="SENTRY_DSN")

    jobs_dir: Path = Path("beat_schedules")
    jobs_enabled: bool = True
    jobs_include: Annotated[list[str], NoDecode] = Field(default_factory=list)
    jobs_exclude: Annotated[list[str], NoDecode] = Field(default_factory=list)
    jobs_namespace: str | None = None
    jobs_key_prefix: str | None = None
    jobs_shutdown_budget_seconds: float = Field(default=30.0, gt=0)
    beat_stop_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long a warm stop (SIGTERM/SIGINT) of beat waits for the tick it interrupts to
    send the triggers it admitted; a second signal stops at once."""

    redis_cluster: bool = False
    rabbitmq_consumer_timeout_seconds: int = Field(default=1800, ge=2)
    rabbitmq_delays: Literal["native", "delay_store"] | None = None
    """How delays and retries wait on a RabbitMQ broker: ``native`` (RabbitMQ's delayed
    delivery, whole seconds; the default) or ``delay_store`` (the platform's Redis delay
    store, promoted with publisher confirms). Refused with any other broker."""
    max_payload_bytes: int = Field(default=262_144, ge=1024)
    processed_jobs_ttl_days: int = Field(default=30, ge=1)
    job_status: bool = True
    """Keep what ``jobs show`` reads: the marker in Redis of a job running past half a
    second and the correlation id with its claim. ``false`` answers ``unknown`` for
    running jobs and finds applied ones by id only."""
    job_output_max_bytes: int = Field(default=16_384, ge=0, le=1_048_576)
    """Largest recorded output (a handler's JSON return value); a larger one fails the
    job permanently (dead letter naming this setting). 0 records no output."""
    dead_letter_alert_age_hours: float = Field(default=24.0, gt=0)

    visibility_timeout_seconds: int = Field(default=300, ge=5)
    transport: Literal["platform", "stock"] = "platform"
    fair_queues: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Queues the platform transport consumes fairly across tenants (comma-separated
    names, ``*`` for every queue); see ``platform_tasks.brokers.transport.fair_lanes``."""
    tenant_weights: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    """``tenant=weight,...``: messages a tenant gives per turn on a fair queue (default 1)."""
    delay_poll_interval_seconds: float = Field(default=0.5, gt=0, le=60)
    delay_batch_size: int = Field(default=500, ge=1, le=10_000)
    delay_lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    """How long a promoter publishing to RabbitMQ holds claimed entries before another
    promoter may publish them again (``PLATFORM_RABBITMQ_DELAYS=delay_store``)."""
    outbox_relay: bool = True
    """Whether workers and beat run the outbox relay (``publish(..., tx=)``); turn it off
    only where another process of the deployment runs one."""
    outbox_poll_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    """How often a relay looks for outbox rows without a notification (``LISTEN`` wakes
    it at every commit; this is the fallback)."""
    outbox_batch_size: int = Field(default=500, ge=1, le=10_000)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    processed_jobs_purge_cron: str = "17 3 * * *"
    """When the shipped ``platform.processed_jobs_cleanup`` job runs (5-field cron, UTC)."""
    dead_letter_report_cron: str = "5 * * * *"
    """When the shipped ``platform.dead_letter_age_report`` job runs (5-field cron, UTC)."""

    @field_validator("processed_jobs_purge_cron", "dead_letter_report_cron")
    @classmethod
    def _five_field_cron(cls, value: str) -> str:
        from croniter import croniter

        fields = value.split()
        if len(fields) != 5 or not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a 5-field cron expression (e.g. '17 3 * * *')")
        return " ".join(fields)

    tenants_query: str | None = None
    fanout_batch_size: int = Field(default=500, ge=1, le=10_000)
    fanout_max_queue_depth: int = Field(default=10_000, ge=1, le=10_000_000)
    example_jobs_interval_seconds: int | None = Field(default=None, ge=1)

    # --- notification rails ---------------------------------------------------------
    notification_channels: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["email"])
    provider_rate_limits: Annotated[dict[str, RateLimit], NoDecode] = Field(
        default_factory=lambda: {"resend": RateLimit(5, 1)}
    )
    tenant_rate_limits: Annotated[dict[str, RateLimit], NoDecode] = Field(default_factory=dict)
    marketing_pause_depth: int = Field(default=100, ge=1)
    marketing_resume_depth: int = Field(default=10, ge=0)
    resend_api_key: SecretStr | None = None
    resend_base_url: str = "https://api.resend.com"

    # --- dead-letter incidents (Better Stack) -----------------------------------------
    betterstack_api_token: SecretStr | None = None
    """Better Stack Uptime API token: dead-letter groups open and resolve incidents."""
    betterstack_api_url: str | None = Field(default=None, validate_default=True)
    """Better Stack Uptime API base URL (``https://uptime.betterstack.com``); required with
    the token and refused without it."""
    betterstack_requester_email: str | None = None
    """``requester_email`` of the incidents the platform opens (optional)."""
    alert_send_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often each worker's alert sender looks for dead letters to count, groups to
    resolve and calls to (re)try."""
    alert_retry_seconds: float = Field(default=30.0, gt=0, le=86_400)
    """How long after a failed call (5xx, timeout, refused token) it is tried again."""
    alert_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    """Bound of each phase of one call to an alert sink (connect, send, each read); the
    whole answer is cut at twice this."""

    # --- batches ---------------------------------------------------------------------
    batch_stall_seconds: float = Field(default=3600.0, ge=0, le=30 * 86_400)
    """A batch with children outstanding and no child ended for this long raises one
    stall alert (``batches.watchdog``); 0 turns the watchdog off."""
    batch_watch_interval_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How often each worker's batch watchdog looks for stalled batches."""

    @field_validator("jobs_include", "jobs_exclude", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return _split_globs(value)

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _redis_like_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if "://" not in value:
            raise ValueError(
                f"{redact_url(value)!r} is not a URL (expected e.g. redis://host:6379/0)"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        problem = postgres_url_problem(value)
        if problem:
            raise ValueError(f"{redact_url(value)} is not a valid PostgreSQL URL: {problem}")
        return value

    @field_validator("notification_channels", mode="before")
    @classmethod
    def _channels(cls, value: Any) -> Any:
        names = _split_globs(value)
        if isinstance(names, list):
            if not names:
                raise ValueError("at least one channel is needed (e.g. email)")
            for name in names:
                if not isinstance(name, str) or not _CHANNEL_NAME.fullmatch(name):
                    raise ValueError(
                        f"channel {name!r} must be lower-case letters, digits and _ "
                        "(it becomes part of a queue name)"
                    )
        return names

    @field_validator("provider_rate_limits", "tenant_rate_limits", mode="before")
    @classmethod
    def _rate_limits(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_rate_limits(value)
        return value

    @field_validator("fair_queues", mode="before")
    @classmethod
    def _fair_queues(cls, value: Any, info: ValidationInfo) -> Any:
        """Fairness lives in the platform Redis transport; set where that transport does not
        run it would silently mean nothing, so it is refused there."""
        names = _split_globs(value)
        if not names:
            return names
        if info.data.get("transport") == "stock":
            raise ValueError(
                "needs the platform transport: kombu's stock transport (PLATFORM_TRANSPORT="
                "stock) consumes a queue in arrival order"
            )
        url = info.data.get("broker_url") or info.data.get("redis_url") or ""
        scheme = str(url).partition("://")[0].rpartition("+")[2]
        if scheme not in ("redis", "rediss"):
            raise ValueError(
                f"applies to a Redis broker (redis://) only; the broker is {scheme or 'unknown'}"
                ":// (RabbitMQ has no fair dequeue by tenant: see docs/brokers.md)"
            )
        return names

    @field_validator("tenant_weights", mode="before")
    @classmethod
    def _tenant_weights(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_tenant_weights(value)
        return value

    @field_validator("marketing_resume_depth")
    @classmethod
    def _resume_below_pause(cls, value: int, info: ValidationInfo) -> int:
        pause = info.data.get("marketing_pause_depth")
        if isinstance(pause, int) and value >= pause:
            raise ValueError(f"must be below PLATFORM_MARKETING_PAUSE_DEPTH ({pause}), got {value}")
        return value

    @field_validator("fanout_max_queue_depth")
    @classmethod
    def _room_for_a_batch(cls, value: int, info: ValidationInfo) -> int:
        batch = info.data.get("fanout_batch_size")
        if isinstance(batch, int) and value < batch:
            raise ValueError(
                f"must be at least PLATFORM_FANOUT_BATCH_SIZE ({batch}), got {value}: "
                "a fan-out publishes whole batches"
            )
        return value

    @field_validator("resend_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("betterstack_api_token", mode="before")
    @classmethod
    def _empty_token(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("betterstack_api_url", mode="before")
    @classmethod
    def _betterstack_url(cls, value: Any, info: ValidationInfo) -> Any:
        """Both or neither: a token without a URL would lose every incident silently, and
        a URL without a token would be refused by Better Stack on every call."""
        if isinstance(value, str) and not value.strip():
            value = None
        token = info.data.get("betterstack_api_token")
        if value is None:
            if token is not None:
                raise ValueError(
                    f"required when {ENV_PREFIX}BETTERSTACK_API_TOKEN is set "
                    "(e.g. https://uptime.betterstack.com)"
                )
            return None
        if "betterstack_api_token" in info.data and token is None:
            raise ValueError(
                f"set without {ENV_PREFIX}BETTERSTACK_API_TOKEN: Better Stack would refuse "
                "every call; set both or neither"
            )
        return check_base_url(str(value))

    @field_validator("rabbitmq_delays")
    @classmethod
    def _rabbitmq_delays_need_rabbitmq(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Set on another broker it would silently mean nothing (a Redis broker's delays
        always wait in the delay store), so it is refused there."""
        if value is None:
            return value
        url = info.data.get("broker_url") or info.data.get("redis_url") or ""
        scheme = str(url).partition("://")[0].rpartition("+")[2]
        if scheme not in ("amqp", "amqps", "pyamqp"):
            raise ValueError(
                "applies to a RabbitMQ broker (amqp://) only; the broker is "
                f"{scheme or 'unknown'}://, whose delays always wait in the delay store"
            )
        return value

    @property
    def rabbitmq_delay_mode(self) -> Literal["native", "delay_store"]:
        """``PLATFORM_RABBITMQ_DELAYS``, or its default ``native``."""
        return self.rabbitmq_delays or "native"

    @property
    def effective_broker_url(self) -> str:
        """The broker Celery connects to: ``broker_url`` or, by default, ``redis_url``."""
        return self.broker_url or self.redis_url

    @property
    def visibility_timeout(self) -> timedelta:
        return timedelta(seconds=self.visibility_timeout_seconds)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PlatformSettings:
        """Read and validate settings, turning pydantic's error into one naming variables."""
        try:
            if environ is None:
                return cls()
            values = _values_from_mapping(environ)
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _settings_error(exc) from None

    @classmethod
    def build(cls, **values: Any) -> PlatformSettings:
        """Build settings from explicit values (tests, embedding) with the same validation."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _settings_error(exc) from None

    @field_validator("tenants_query")
    @classmethod
    def _tenants_query(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not value.strip().lower().startswith(("select", "with", "values", "table")):
            raise ValueError("must be a SELECT returning tenant_id, freshness_tier")
        single_statement(value)  # ValueError: more than one statement
        return value


def variable_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    if field == "sentry_dsn":
        return "SENTRY_DSN"
    return f"{ENV_PREFIX}{field.upper()}"


def _values_from_mapping(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in PlatformSettings.model_fields:
        var = variable_name(name)
        if var in environ:
            values[name] = environ[var]
    return values


def _settings_error(exc: ValidationError) -> SettingsError:
    problems: list[tuple[str, str]] = []
    for error in exc.errors():
        loc = error.get("loc") or ("?",)
        field = str(loc[0])
        if field == "SENTRY_DSN":
            field = "sentry_dsn"
        problems.append((variable_name(field), error.get("msg", "invalid value")))
    return SettingsError(problems)
