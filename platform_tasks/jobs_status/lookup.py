"""Answer "where is job X" from the stores the platform already keeps.

:func:`job_status` answers one job id, :func:`jobs_of_correlation` every job of one
correlation id; both read, in this order, stopping as soon as the answer is settled:

1. PostgreSQL, three indexed reads: committed claims (``core.processed_jobs``, with the
   recorded output), dead letters and cancels (``core.dead_letters``), and rows the
   outbox relays have not sent yet (``core.outbox``);
2. the platform's Redis: the job's running marker (one ``HGETALL``) and the paused queues;
3. the broker's Redis: one server-side search of the queue lists, tenant lanes, fetched
   messages and the delay store (:mod:`~platform_tasks.jobs_status.redis_search`).

An applied, cancelled or dead-lettered job is answered by step 1 alone (about a
millisecond however many rows the tables hold); only a job still on its way pays for
the search. :class:`StatusReader` keeps its connections between questions (the console,
a benchmark); the two functions open and close one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg2
import psycopg2.extras

from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.consumer.queue_pause import read_paused
from platform_tasks.jobs_status.model import Facts, JobStatus, decide, job_time, publish_order
from platform_tasks.jobs_status.outbox_rows import belongs, spellings
from platform_tasks.jobs_status.redis_search import Places, RedisSearch, wire_text
from platform_tasks.keys import running_key
from platform_tasks.postgres.database import require_database_url
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["CORRELATION_LIMIT", "StatusReader", "job_status", "jobs_of_correlation"]

_QUERIES = load_queries("job_status")

CORRELATION_LIMIT = 10_000
"""Most jobs listed for one correlation id (per store)."""


class StatusReader:
    """Answers job status questions on connections it keeps until :meth:`close`."""

    def __init__(
        self, source: PlatformCelery | PlatformSettings, *, queues: Iterable[str] = ()
    ) -> None:
        self.places = Places.of(source, queues)
        self.settings = self.places.settings
        self._pg: Any = None
        self._platform: Any = None
        self.search = RedisSearch(self.places)

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None
        if self._platform is not None:
            self._platform.close()
            self._platform = None
        self.search.close()

    def __enter__(self) -> StatusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the questions ------------------------------------------------------------------

    def job(self, job_id: str | uuid.UUID) -> JobStatus:
        """The one state of ``job_id``."""
        text = _job_id(job_id)
        facts = self._new_facts(text)
        with self._cursor() as cur:
            self._rows(cur, "by_job", {"job_id": text}, {text: facts})
            self._operations(cur, [facts])
        if self._settled(facts):
            return decide(facts)
        facts.marker = self._markers([text])[text]
        if facts.marker:
            return decide(facts)
        facts.paused = self._paused()
        created = job_time(text)
        near = int(created.timestamp() * 1000) if created is not None else None
        facts.found = [m.found for m in self.search.find(text, 1, near_ms=near) if m.job_id == text]
        return decide(facts)

    def correlation(self, correlation_id: str) -> list[JobStatus]:
        """Every job of ``correlation_id`` found, in publish order where known."""
        if not correlation_id.strip():
            raise ValueError("correlation id must not be empty")
        facts: dict[str, Facts] = {}
        params = {**spellings(correlation_id), "limit": CORRELATION_LIMIT}
        with self._cursor() as cur:
            self._rows(cur, "by_correlation", params, facts)
            self._paused()
            tail = f" correlation_id={correlation_id})"
            matches = [
                m
                for m in self.search.find(wire_text(tail), CORRELATION_LIMIT)
                if m.argsrepr.endswith(tail)
            ]
            for match in matches:
                self._facts(facts, match.job_id).found.append(match.found)
            self._operations(cur, list(facts.values()))
        open_ids = [job for job, f in facts.items() if not self._settled(f)]
        for job, marker in self._markers(open_ids).items():
            facts[job].marker = marker
        paused = self._paused()
        for item in facts.values():
            item.paused = paused
        ordered = sorted(facts, key=publish_order)
        return [_with_correlation(decide(facts[job]), correlation_id) for job in ordered]

    # -- reading ------------------------------------------------------------------------

    def _new_facts(self, job_id: str) -> Facts:
        return Facts(
            job_id,
            unseen=self.search.unseen(),
            keep_days=self.settings.processed_jobs_ttl_days,
        )

    def _facts(self, facts: dict[str, Facts], job_id: str) -> Facts:
        if job_id not in facts:
            facts[job_id] = self._new_facts(job_id)
        return facts[job_id]

    def _cursor(self) -> Any:
        if self._pg is None or self._pg.closed:
            url = require_database_url(self.settings)
            self._pg = psycopg2.connect(url, connect_timeout=5)
            self._pg.autocommit = True
        return self._pg.cursor(cursor_factory=psycopg2.extras.RealDictCursor)

    def _rows(self, cur: Any, suffix: str, params: dict[str, Any], facts: dict[str, Facts]) -> None:
        params = {**params, "profile": self.settings.profile}
        for store in ("processed", "dead_letters", "outbox"):
            cur.execute(_QUERIES[f"{store}_{suffix}"], params)
            for row in cur.fetchall():
                found = dict(row)
                message = found.pop("message", None)  # outbox by correlation: checked here
                if message is not None and not belongs(
                    found["broker"], message, params["correlation_id"]
                ):
                    continue
                getattr(self._facts(facts, str(found["job_id"])), store).append(found)

    def _operations(self, cur: Any, facts: list[Facts]) -> None:
        for item in facts:
            cancel = next((d for d in item.dead_letters if d["reason"] == "cancelled"), None)
            if cancel is None:
                continue
            reason = str(cancel.get("discard_reason") or "")
            operation = reason.rsplit(" ", 1)[-1]
            if operation.isdigit():
                cur.execute(_QUERIES["operation"], {"id": int(operation)})
                row = cur.fetchone()
                item.operation = dict(row) if row is not None else None

    @staticmethod
    def _settled(facts: Facts) -> bool:
        """Whether PostgreSQL alone answers: applied, cancelled, or dead-lettered for good."""
        if facts.processed or any(d["reason"] == "cancelled" for d in facts.dead_letters):
            return True
        return bool(facts.dead_letters) and facts.dead_letters[0]["status"] != "replayed"

    def _platform_client(self) -> Any:
        if self._platform is None:
            self._platform = build_redis(self.settings, timeout=5, connect_timeout=5)
        return self._platform

    def _markers(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        if not job_ids:
            return {}
        pipe = self._platform_client().pipeline(transaction=False)
        for job in job_ids:
            pipe.hgetall(running_key(self.settings.profile, job))
        return {
            job: {_text(k): _text(v) for k, v in raw.items()}
            for job, raw in zip(job_ids, pipe.execute(), strict=True)
        }

    def _paused(self) -> dict[str, Any]:
        """The paused queues (searched too: a paused queue is where jobs pile up)."""
        paused = read_paused(self._platform_client(), self.settings.profile)
        self.search.places = self.places.with_queues(paused)
        return {
            name: {"operation_id": p.operation_id, "actor": p.actor, "since": p.since.isoformat()}
            for name, p in paused.items()
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job_id(value: str | uuid.UUID) -> str:
    try:
        return str(uuid.UUID(str(value).strip()))
    except ValueError:
        raise ValueError(f"job id {str(value)!r} is not a UUID") from None


def _with_correlation(status: JobStatus, correlation_id: str) -> JobStatus:
    if status.correlation_id is not None:
        return status
    return JobStatus(status.job_id, status.state, status.details, correlation_id, status.output)


def job_status(source: PlatformCelery | PlatformSettings, job_id: str | uuid.UUID) -> JobStatus:
    """Where job ``job_id`` is: exactly one state with its details.

    ``source`` is the app (its queues and broker options are searched) or bare settings
    (``default``, ``PLATFORM_CONSOLE_QUEUES``, paused and fair queues). Raises
    ``ValueError`` for an id that is not a UUID.
    """
    with StatusReader(source) as reader:
        return reader.job(job_id)


def jobs_of_correlation(
    source: PlatformCelery | PlatformSettings, correlation_id: str
) -> list[JobStatus]:
    """Every job of one request (correlation id) with its state, in publish order where
    the job ids tell it (the platform's UUIDv7 ids do)."""
    with StatusReader(source) as reader:
        return reader.correlation(correlation_id)
