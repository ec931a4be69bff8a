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
from platform_tasks.notifications.rate_limits import RateLimit, parse_rate_limits

ENV_PREFIX = "PLATFORM_"

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

    redis_cluster: bool = False
    max_payload_bytes: int = Field(default=262_144, ge=1024)
    processed_jobs_ttl_days: int = Field(default=30, ge=1)
    dead_letter_alert_age_hours: float = Field(default=24.0, gt=0)

    visibility_timeout_seconds: int = Field(default=300, ge=5)
    transport: Literal["platform", "stock"] = "platform"
    delay_poll_interval_seconds: float = Field(default=0.5, gt=0, le=60)
    delay_batch_size: int = Field(default=500, ge=1, le=10_000)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)

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
            raise ValueError(f"{value!r} is not a URL (expected e.g. redis://host:6379/0)")
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
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

    @field_validator("marketing_resume_depth")
    @classmethod
    def _resume_below_pause(cls, value: int, info: ValidationInfo) -> int:
        pause = info.data.get("marketing_pause_depth")
        if isinstance(pause, int) and value >= pause:
            raise ValueError(f"must be below PLATFORM_MARKETING_PAUSE_DEPTH ({pause}), got {value}")
        return value

    @field_validator("resend_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")) or "@" in value:
            raise ValueError("must be an http(s):// URL without credentials")
        return value.rstrip("/")

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
