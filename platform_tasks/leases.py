"""Admission of scheduled points and the running lease of a job, as atomic Redis scripts.

Each call is exactly one script round trip judged by the Redis server clock (``TIME``),
so replicas with skewed clocks agree and a crash between two calls leaves nothing half
done. See ``docs/scheduled-jobs.md`` for the admission steps.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from platform_tasks.keys import JobKeys, jobs_namespace
from platform_tasks.scripts import script_source
from platform_tasks.settings import PlatformSettings

__all__ = [
    "Admission",
    "AdmissionOutcome",
    "JobLeases",
    "LeaseOutcome",
    "new_token",
    "resolve_namespace",
]


class AdmissionOutcome(StrEnum):
    """What the admission script decided for one point."""

    ADMITTED = "admitted"
    FUTURE = "future"
    LATE = "late"
    DUPLICATE = "duplicate"
    OVERLAP = "overlap"


class LeaseOutcome(StrEnum):
    RENEWED = "renewed"
    LATE = "late"
    LOST = "lost"


@dataclass(frozen=True)
class Admission:
    outcome: AdmissionOutcome
    redis_now_ms: int


def new_token(owner: str) -> str:
    """A lease owner token unique to one admission."""
    return f"{owner}:{uuid.uuid4().hex}"


def resolve_namespace(settings: PlatformSettings, *, app_name: str, mode: str) -> tuple[str, str]:
    """``(namespace, key_prefix)`` of the job keys for an app in ``mode`` (live/test)."""
    namespace = jobs_namespace(
        app_name=app_name, profile=settings.profile, mode=mode,
        namespace=settings.jobs_namespace,
    )  # fmt: skip
    return namespace, settings.jobs_key_prefix or ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobLeases:
    """The three lease scripts bound to one Redis client and one key namespace.

    The client is the caller's: this class never closes it.
    """

    def __init__(self, client: Any, *, namespace: str, prefix: str = "") -> None:
        self.client = client
        self.namespace = namespace
        self.prefix = prefix
        self._admit = client.register_script(script_source("admit_point"))
        self._renew = client.register_script(script_source("renew_lease"))
        self._release = client.register_script(script_source("release_lease"))

    def keys(self, job: str) -> JobKeys:
        return JobKeys(self.namespace, job, self.prefix)

    def admit(
        self, job: str, *, point_ms: int, period_end_ms: int, token: str, lease_ttl_ms: int,
        now_ms: int | None = None,
    ) -> Admission:  # fmt: skip
        """One round trip: admit ``point_ms`` of ``job`` or say why not.

        ``now_ms`` replaces Redis ``TIME``; only the explicit-tick test scheduler sets it.
        """
        keys = self.keys(job)
        outcome, now = self._admit(
            keys=[keys.marker, keys.lease],
            args=[point_ms, period_end_ms, token, lease_ttl_ms, "" if now_ms is None else now_ms],
        )
        return Admission(AdmissionOutcome(_text(outcome)), int(now))

    def renew(
        self, job: str, *, token: str, lease_ttl_ms: int, deadline_ms: int = 0,
        reacquire: bool = False, now_ms: int | None = None,
    ) -> tuple[LeaseOutcome, int]:  # fmt: skip
        """Extend the lease when ``token`` owns it; refuse from ``deadline_ms`` on."""
        outcome, now = self._renew(
            keys=[self.keys(job).lease],
            args=[token, lease_ttl_ms, deadline_ms, "1" if reacquire else "0",
                  "" if now_ms is None else now_ms],
        )  # fmt: skip
        return LeaseOutcome(_text(outcome)), int(now)

    def release(self, job: str, *, token: str) -> bool:
        """Delete the lease when ``token`` owns it; never touches another owner's lease."""
        return bool(self._release(keys=[self.keys(job).lease], args=[token]))

    def marker(self, job: str) -> int | None:
        value = self.client.get(self.keys(job).marker)
        return None if value is None else int(value)

    def lease_holder(self, job: str) -> str | None:
        value = self.client.get(self.keys(job).lease)
        return None if value is None else _text(value)
