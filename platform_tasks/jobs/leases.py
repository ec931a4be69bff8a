"""Admission of scheduled points and the running lease of a job, as atomic Redis scripts.

Each point is exactly one script call judged by the Redis server clock (``TIME``), so
replicas with skewed clocks agree and a crash between two calls leaves nothing half done.
:meth:`JobLeases.admit_many` sends the calls for many points in one pipeline (one network
round trip; still one atomic script per point). See ``docs/scheduled-jobs.md`` for the
admission steps.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from platform_tasks.brokers.scripts import script_source
from platform_tasks.keys import JobKeys, jobs_namespace
from platform_tasks.settings import PlatformSettings

__all__ = [
    "Admission",
    "AdmissionOutcome",
    "AdmissionRequest",
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


@dataclass(frozen=True)
class AdmissionRequest:
    """One point to admit (the arguments of the admission script)."""

    job: str
    point_ms: int
    period_end_ms: int
    token: str
    lease_ttl_ms: int


def new_token(owner: str) -> str:
    """A lease owner token unique to one admission."""
    return f"{owner}:{uuid.uuid4().hex}"


def resolve_namespace(settings: PlatformSettings, *, app_name: str, mode: str) -> tuple[str, str]:
    """``(namespace, key_prefix)`` of the job keys for an app in ``mode`` (live/test)."""
    namespace = jobs_namespace(
        app_name=app_name,
        profile=settings.profile,
        mode=mode,
        namespace=settings.jobs_namespace,
    )
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
        self._keys: dict[str, JobKeys] = {}

    def load_scripts(self) -> None:
        """Load the scripts into Redis now (every primary of a cluster), so the first
        pipeline of admissions is not refused with NOSCRIPT and sent twice."""
        for script in (self._admit, self._renew, self._release):
            self.client.script_load(script.script)

    def keys(self, job: str) -> JobKeys:
        keys = self._keys.get(job)
        if keys is None:
            keys = self._keys[job] = JobKeys(self.namespace, job, self.prefix)
        return keys

    def admit(
        self,
        job: str,
        *,
        point_ms: int,
        period_end_ms: int,
        token: str,
        lease_ttl_ms: int,
        now_ms: int | None = None,
    ) -> Admission:
        """One round trip: admit ``point_ms`` of ``job`` or say why not.

        ``now_ms`` replaces Redis ``TIME``; only the explicit-tick test scheduler sets it.
        """
        keys = self.keys(job)
        outcome, now = self._admit(
            keys=[keys.marker, keys.lease],
            args=[point_ms, period_end_ms, token, lease_ttl_ms, "" if now_ms is None else now_ms],
        )
        return Admission(AdmissionOutcome(_text(outcome)), int(now))

    def admit_many(
        self, requests: Sequence[AdmissionRequest], *, now_ms: int | None = None
    ) -> list[Admission | RedisError]:
        """Admit many points in one pipeline: one script call per point, one round trip.

        Returns one entry per request, in order: the :class:`Admission`, or the
        :class:`RedisError` that script call failed with. A connection error of the whole
        pipeline raises. ``now_ms`` as in :meth:`admit`.
        """
        now_arg: int | str = "" if now_ms is None else now_ms
        replies = self._pipeline(
            self._admit,
            [
                (
                    (keys.marker, keys.lease),
                    (r.point_ms, r.period_end_ms, r.token, r.lease_ttl_ms, now_arg),
                )
                for r in requests
                for keys in (self.keys(r.job),)
            ],
        )
        return [
            reply
            if isinstance(reply, RedisError)
            else Admission(AdmissionOutcome(_text(reply[0])), int(reply[1]))
            for reply in replies
        ]

    def release_many(self, pairs: Sequence[tuple[str, str]]) -> list[bool | RedisError]:
        """:meth:`release` for many ``(job, token)`` pairs in one pipeline."""
        replies = self._pipeline(
            self._release, [((self.keys(job).lease,), (token,)) for job, token in pairs]
        )
        return [r if isinstance(r, RedisError) else bool(r) for r in replies]

    def _pipeline(
        self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """EVALSHA of ``script`` for every ``(keys, args)`` in one non-transactional
        pipeline. Calls refused with NOSCRIPT (a restarted or flushed server) did not
        run: the script is loaded and those calls are sent again, once.

        ``execute_command`` rather than ``evalsha``: redis-py blocks the latter in Cluster
        pipelines because it cannot know the keys share a slot; ours always do (one
        hash tag per job), and the cluster pipeline routes each call by its keys.
        """
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for index in todo:
                keys, args = calls[index]
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            missing = []
            for index, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt == 0:
                    missing.append(index)
                else:
                    replies[index] = answer
            if not missing:
                break
            self.client.script_load(script.script)
            todo = missing
        return replies

    def renew(
        self,
        job: str,
        *,
        token: str,
        lease_ttl_ms: int,
        deadline_ms: int = 0,
        reacquire: bool = False,
        now_ms: int | None = None,
    ) -> tuple[LeaseOutcome, int]:
        """Extend the lease when ``token`` owns it; refuse from ``deadline_ms`` on."""
        outcome, now = self._renew(
            keys=[self.keys(job).lease],
            args=[
                token,
                lease_ttl_ms,
                deadline_ms,
                "1" if reacquire else "0",
                "" if now_ms is None else now_ms,
            ],
        )
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
