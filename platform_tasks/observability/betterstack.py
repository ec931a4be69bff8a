"""Better Stack incidents over its Uptime API: open one, resolve one, check the settings.

Only the alert sender calls this, from its own thread and from what
``core.alert_incidents`` records, never a delivery: a call that fails raises
:class:`SinkCallFailed` and is tried again later from the table. Every call is bounded by
``PLATFORM_ALERT_TIMEOUT_SECONDS`` (connect, send and each read, and the whole answer
within twice that), so a Better Stack that hangs costs the sender one bounded call at a
time and never a job.

The API (https://betterstack.com/docs/uptime/api/): ``Authorization: Bearer <token>``;
``POST /api/v2/incidents`` with ``summary``, ``name``, ``description`` and, when set,
``requester_email`` answers 201 with ``{"data": {"id": ...}}``;
``POST /api/v2/incidents/<id>/resolve`` with ``resolved_by`` answers 200, or 409 when the
incident was resolved already (someone resolved it by hand: nothing left to do).

The token is never logged and never part of an error: errors carry the status, the
path and the start of Better Stack's answer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from platform_tasks.settings import ENV_PREFIX, PlatformSettings

__all__ = ["SINK", "BetterStackIncidents", "IncidentText", "SinkCallFailed"]

logger = logging.getLogger(__name__)

SINK = "betterstack"
"""The sink's name in ``core.alert_incidents.sink`` and in log lines."""

TOKEN_VARIABLE = f"{ENV_PREFIX}BETTERSTACK_API_TOKEN"
URL_VARIABLE = f"{ENV_PREFIX}BETTERSTACK_API_URL"

_ANSWER_CHARS = 200
"""How much of an error answer goes into ``last_error`` and the log."""

MAX_ANSWER_BYTES = 1_000_000
"""The most of an answer read: an incident's JSON is a few kilobytes."""


class SinkCallFailed(Exception):
    """A call to the sink did not do its work (unreachable, timeout, refused, 5xx...).

    ``refused`` is set for 401/403: the token is wrong or lacks the right, which needs
    an operator, though the call is still retried (a token can be fixed at the sink).
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class IncidentText:
    """What an incident says: a one-line summary, a short name, the full description."""

    summary: str
    name: str
    description: str


class BetterStackIncidents:
    """A client of Better Stack's incidents, with bounded calls and no secret in errors."""

    sink = SINK

    def __init__(
        self,
        base_url: str,
        token: SecretStr | str,
        *,
        timeout: float,
        requester_email: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        self.base_url = base_url.rstrip("/")
        self.requester_email = requester_email
        self.timeout = timeout
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
            timeout=httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=False,
        )

    @classmethod
    def from_settings(cls, settings: PlatformSettings) -> BetterStackIncidents | None:
        """The client the settings ask for, or ``None`` when Better Stack is not set."""
        token = settings.betterstack_api_token
        if token is None or settings.betterstack_api_url is None:
            return None
        return cls(
            settings.betterstack_api_url,
            token,
            timeout=settings.alert_timeout_seconds,
            requester_email=settings.betterstack_requester_email,
        )

    def open(self, text: IncidentText) -> str:
        """Open an incident (Better Stack alerts the on-call person); return its id."""
        body: dict[str, Any] = {
            "summary": text.summary,
            "name": text.name,
            "description": text.description,
        }
        if self.requester_email:
            body["requester_email"] = self.requester_email
        answer = self._post("/api/v2/incidents", body)
        if answer.status_code not in (200, 201):
            raise _failure("open an incident", answer)
        try:
            incident_id = answer.json()["data"]["id"]
        except (ValueError, KeyError, TypeError):
            raise SinkCallFailed(
                f"open an incident: answer {answer.status_code} without data.id: "
                f"{answer.text[:_ANSWER_CHARS]!r}"
            ) from None
        return str(incident_id)

    def resolve(self, incident_id: str, note: str) -> None:
        """Resolve the incident with ``note`` as ``resolved_by``; already resolved is done."""
        path = f"/api/v2/incidents/{incident_id}/resolve"
        answer = self._post(path, {"resolved_by": note})
        if answer.status_code == 409:  # resolved by hand before: what we wanted
            return
        if answer.status_code == 404:  # deleted at Better Stack: nothing left to resolve
            logger.warning(
                "Better Stack has no incident %s to resolve (deleted there?)",
                incident_id,
                extra={"event": "alert.incident_missing", "sink": SINK, "incident_id": incident_id},
            )
            return
        if answer.status_code != 200:
            raise _failure(f"resolve incident {incident_id}", answer)

    def check(self) -> tuple[str, str] | None:
        """``(variable, problem)`` when Better Stack is unreachable or refuses the token.

        Lists one incident (a read that changes nothing). Called once at start-up.
        """
        try:
            answer = self._client.get("/api/v2/incidents", params={"per_page": 1})
        except httpx.HTTPError as exc:
            return URL_VARIABLE, f"{self.base_url} is unreachable ({_describe(exc)})"
        if answer.status_code in (401, 403):
            return TOKEN_VARIABLE, f"Better Stack refused the token ({answer.status_code})"
        if answer.status_code >= 400:
            return URL_VARIABLE, (
                f"{self.base_url} answered {answer.status_code} to GET /api/v2/incidents "
                "(is it Better Stack's Uptime API?)"
            )
        return None

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST ``body``; the whole call ends within about twice the timeout.

        httpx bounds each phase (connect, send, each read) but not their sum, so a
        server that trickles its answer could hold a call for ever: the answer is read
        in chunks against a deadline, and at most :data:`MAX_ANSWER_BYTES` of it.
        """
        deadline = time.monotonic() + self.timeout * 2
        try:
            with self._client.stream("POST", path, json=body) as answer:
                chunks: list[bytes] = []
                size = 0
                for chunk in answer.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise SinkCallFailed(
                            f"POST {path}: answer larger than {MAX_ANSWER_BYTES} bytes"
                        )
                    if time.monotonic() > deadline:
                        raise SinkCallFailed(
                            f"POST {path}: answer not complete after {self.timeout * 2:.1f}s"
                        )
                return httpx.Response(
                    answer.status_code, headers=answer.headers, content=b"".join(chunks)
                )
        except httpx.HTTPError as exc:
            raise SinkCallFailed(f"POST {path}: {_describe(exc)}") from None


def _describe(exc: httpx.HTTPError) -> str:
    """The error's type and message; httpx's messages name the URL, never the headers."""
    text = str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


def _failure(what: str, answer: httpx.Response) -> SinkCallFailed:
    refused = answer.status_code in (401, 403)
    hint = f" (check {TOKEN_VARIABLE})" if refused else ""
    return SinkCallFailed(
        f"{what}: Better Stack answered {answer.status_code}{hint}: "
        f"{answer.text[:_ANSWER_CHARS]!r}",
        refused=refused,
    )
