"""The Resend adapter: ``POST /emails`` and ``POST /emails/batch``, and nothing else.

Contacts, audiences, segments and broadcasts are never touched: the product's own store
is the source of truth for recipients, so the adapter refuses any other path before a
request is built (:data:`ALLOWED_PATHS`).

Batches are validated per email (``x-batch-validation: permissive``): Resend sends the
valid emails and lists the others in ``errors`` (``[{index, message}]``), which the
result carries as ``rejected``; in strict mode one bad address refused the whole batch.

Bodies are serialized deterministically (sorted keys), so a retried job sends the same
bytes under the same ``Idempotency-Key`` and Resend answers with the original ids instead
of ``invalid_idempotent_request``. The API key lives in a :class:`~pydantic.SecretStr`
and in the client's default headers only; errors are built from the response's
``statusCode``/``name``/``message``, never from request headers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from pydantic import SecretStr

from platform_tasks.notifications.message import EmailMessage, refuse_batch_only_fields
from platform_tasks.notifications.provider import (
    ProviderBusy,
    ProviderQuotaExceeded,
    ProviderRateLimited,
    ProviderRejected,
    ProviderUnavailable,
    RateLimitHeaders,
    RejectedItem,
    SendResult,
)

__all__ = ["ALLOWED_PATHS", "BATCH_LIMIT", "ResendProvider"]

SINGLE_PATH = "/emails"
BATCH_PATH = "/emails/batch"
ALLOWED_PATHS = frozenset({SINGLE_PATH, BATCH_PATH})
BATCH_LIMIT = 100
MAX_IDEMPOTENCY_KEY = 256
QUOTA_ERRORS = frozenset({"daily_quota_exceeded", "monthly_quota_exceeded"})


def _number(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def rate_limit_headers(headers: Mapping[str, str]) -> RateLimitHeaders:
    return RateLimitHeaders(
        limit=_number(headers, "ratelimit-limit"),
        remaining=_number(headers, "ratelimit-remaining"),
        reset_seconds=_number(headers, "ratelimit-reset"),
    )


class ResendProvider:
    """Sends emails through Resend's HTTP API with an :mod:`httpx` client."""

    name = "resend"
    max_batch = BATCH_LIMIT

    def __init__(
        self,
        api_key: SecretStr | None,
        base_url: str,
        *,
        timeout: float = 15.0,
        name: str = "resend",
    ) -> None:
        if api_key is None or not api_key.get_secret_value():
            from platform_tasks.errors import ConfigurationError

            raise ConfigurationError("PLATFORM_RESEND_API_KEY is not set (needed to send email)")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            headers={
                "Authorization": f"Bearer {api_key.get_secret_value()}",
                "User-Agent": "platform-tasks",
            },
        )

    def __repr__(self) -> str:
        return f"ResendProvider(base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def send(self, messages: Sequence[Any], *, idempotency_key: str, batch: bool) -> SendResult:
        emails = [
            m if isinstance(m, EmailMessage) else EmailMessage.model_validate(m) for m in messages
        ]
        if not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
            raise ValueError("an Idempotency-Key has 1 to 256 characters")
        if batch:
            if not 1 <= len(emails) <= BATCH_LIMIT:
                raise ProviderRejected(
                    f"a batch holds 1 to {BATCH_LIMIT} emails, got {len(emails)}",
                    provider=self.name,
                )
            refuse_batch_only_fields(emails)
            body: Any = [m.to_resend() for m in emails]
            path = BATCH_PATH
        else:
            if len(emails) != 1:
                raise ValueError(f"a single send takes exactly one email, got {len(emails)}")
            body = emails[0].to_resend()
            path = SINGLE_PATH
        response = self._post(path, body, idempotency_key, batch=batch)
        payload = self._json(response)
        rejected: list[RejectedItem] = []
        if batch:
            ids = [str(item["id"]) for item in payload.get("data") or []]
            rejected = [
                RejectedItem(int(error["index"]), str(error.get("message") or "")[:500])
                for error in payload.get("errors") or []
            ]
        else:
            ids = [str(payload["id"])]
        return SendResult(ids=ids, limits=rate_limit_headers(response.headers), rejected=rejected)

    def _post(self, path: str, body: Any, idempotency_key: str, *, batch: bool) -> httpx.Response:
        if path not in ALLOWED_PATHS:  # the one place a request is made
            raise RuntimeError(f"the Resend adapter never calls {path}")
        headers = {"Idempotency-Key": idempotency_key, "Content-Type": "application/json"}
        if batch:
            headers["x-batch-validation"] = "permissive"
        content = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        try:
            response = self._client.post(path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(
                f"Resend {path}: {type(exc).__name__}: {exc}", provider=self.name
            ) from None
        if response.status_code < 300:
            return response
        raise self._error(path, response)

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            payload = response.json()
        except ValueError:
            raise ProviderUnavailable(
                f"Resend answered {response.status_code} with a body that is not JSON",
                provider=self.name,
                status=response.status_code,
            ) from None
        return payload if isinstance(payload, dict) else {"data": payload}

    def _error(self, path: str, response: httpx.Response) -> Exception:
        status = response.status_code
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        payload = payload if isinstance(payload, dict) else {}
        name = str(payload.get("name") or "")
        detail = str(payload.get("message") or "")[:500]
        text = f"Resend {path} answered {status} {name or '(no name)'}: {detail}".rstrip(": ")
        headers = response.headers
        if status == 429:
            limits = rate_limit_headers(headers)
            retry_after = _number(headers, "retry-after")
            if name in QUOTA_ERRORS:
                return ProviderQuotaExceeded(
                    text,
                    provider=self.name,
                    name=name,
                    reset_seconds=retry_after or limits.reset_seconds,
                )
            wait = retry_after if retry_after is not None else (limits.reset_seconds or 1.0)
            return ProviderRateLimited(
                text, provider=self.name, retry_after=max(wait, 0.0), limits=limits
            )
        if status == 409 and name == "concurrent_idempotent_requests":
            return ProviderBusy(
                text, provider=self.name, retry_after=_number(headers, "retry-after") or 1.0
            )
        if status >= 500 or status in (401, 403, 408):
            # a server fault, or an account problem an operator fixes without losing jobs
            return ProviderUnavailable(text, provider=self.name, status=status, name=name)
        return ProviderRejected(text, provider=self.name, status=status, name=name)
