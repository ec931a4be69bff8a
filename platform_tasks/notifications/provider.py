"""The provider port: what the platform needs from an email, SMS or push provider.

An adapter sends one request (one message, or a batch) under an idempotency key and
either returns a :class:`SendResult` or raises one of the errors below; the platform maps
those to outcomes the same way for every provider, by provider name:

- :class:`ProviderRateLimited` (a 429 "slow down") → every worker backs off until
  ``retry_after``, the job runs again then, no attempt spent;
- :class:`ProviderQuotaExceeded` → the provider is paused until the quota resets, one
  alert, jobs wait;
- :class:`ProviderBusy` (the same idempotency key is being processed) → run again shortly;
- :class:`ProviderRejected` (validation, conflicting idempotent request) → dead letter;
- :class:`ProviderUnavailable` (5xx, network) → an ordinary failed attempt, retried with
  backoff.

Errors carry only what the provider said about the failure: never a request header, so
an API key cannot reach a log line, Flower or Sentry through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from platform_tasks.errors import PermanentError, PlatformError

__all__ = [
    "Provider",
    "ProviderBusy",
    "ProviderError",
    "ProviderQuotaExceeded",
    "ProviderRateLimited",
    "ProviderRejected",
    "ProviderUnavailable",
    "RateLimitHeaders",
    "RejectedItem",
    "SendResult",
]


@dataclass(frozen=True)
class RateLimitHeaders:
    """``ratelimit-limit`` / ``-remaining`` / ``-reset`` of a response (``None``: absent)."""

    limit: float | None = None
    remaining: float | None = None
    reset_seconds: float | None = None


@dataclass(frozen=True)
class RejectedItem:
    """A message of a batch the provider refused while it sent the others.

    ``index`` is its place in the request; ``message`` what the provider said.
    """

    index: int
    message: str


@dataclass(frozen=True)
class SendResult:
    """The provider's ids of the messages sent (in order), the messages of the request it
    refused one by one (``rejected``: a batch validated per email) and its rate-limit
    headers."""

    ids: list[str]
    limits: RateLimitHeaders = field(default_factory=RateLimitHeaders)
    rejected: list[RejectedItem] = field(default_factory=list)


@runtime_checkable
class Provider(Protocol):
    """A provider adapter; ``name`` keys its rate limit (``PLATFORM_PROVIDER_RATE_LIMITS``)."""

    name: str
    max_batch: int
    """Most messages one request may carry."""

    def send(self, messages: Sequence[Any], *, idempotency_key: str, batch: bool) -> SendResult:
        """Send ``messages`` in one request (``batch``: the batch endpoint, else exactly one)."""
        ...

    def close(self) -> None: ...


class ProviderError(PlatformError):
    """A provider request failed; ``status`` and ``name`` are what the provider answered."""

    def __init__(
        self, message: str, *, provider: str, status: int | None = None, name: str | None = None
    ) -> None:
        self.provider = provider
        self.status = status
        self.name = name
        super().__init__(message)


class ProviderUnavailable(ProviderError):
    """5xx, timeout or network error: transient, retried with backoff as an ordinary failure."""


class ProviderRateLimited(ProviderError):
    """429 ``rate_limit_exceeded``: nobody sends to this provider for ``retry_after`` seconds."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retry_after: float,
        limits: RateLimitHeaders | None = None,
    ) -> None:
        self.retry_after = retry_after
        self.limits = limits or RateLimitHeaders()
        super().__init__(message, provider=provider, status=429, name="rate_limit_exceeded")


class ProviderQuotaExceeded(ProviderError):
    """429 daily/monthly quota: waiting seconds does not fix it; ``reset_seconds`` may."""

    def __init__(
        self, message: str, *, provider: str, name: str, reset_seconds: float | None
    ) -> None:
        self.reset_seconds = reset_seconds
        super().__init__(message, provider=provider, status=429, name=name)


class ProviderBusy(ProviderError):
    """409 ``concurrent_idempotent_requests``: the same key is in flight; retry shortly."""

    def __init__(self, message: str, *, provider: str, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        super().__init__(
            message, provider=provider, status=409, name="concurrent_idempotent_requests"
        )


class ProviderRejected(ProviderError, PermanentError):
    """Validation error or conflicting idempotent request: retrying cannot fix it."""
