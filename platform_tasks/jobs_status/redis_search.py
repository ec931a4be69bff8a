"""Where a job waits in Redis: queue lists, tenant lanes, fetched messages, delay store.

Nothing is written when a job is published or moved to find it later (an index kept at
publish would cost every job a write on the hot path). Instead the search runs on the
Redis server (``find_messages.lua``): it reads the lists and hashes in chunks and returns
only the messages whose text holds the job id (Celery's task id header) or the
correlation id (the ``argsrepr`` header), so 100,000 waiting messages cost the server a
scan of memory and the client one reply of a few hundred bytes. The script runs in one
call per server; a search that reads every message (an id no store has, a correlation
id) keeps that server busy for about a microsecond per waiting message of 1.5 KB, almost
all of it Redis copying each message into Lua (``bench/job_status_scan.py``, BENCHMARKS.md).

What is searched: every priority list of each queue of :class:`Places` (the app's
queues, or without an app ``default``, ``PLATFORM_CONSOLE_QUEUES`` and the paused and
fair ones), the tenant lanes of those lists (their ring names the tenants), kombu's
``unacked`` hash (fetched by a worker, not acknowledged yet), and the delay store's
entries. A RabbitMQ broker's queues cannot be searched (AMQP has no peek): a job waiting
there reads ``unknown`` with a note that says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platform_tasks.brokers.delay_location import delay_store_location
from platform_tasks.brokers.scripts import script_source
from platform_tasks.brokers.selection import broker_kind
from platform_tasks.brokers.transport.fair_metrics import PRIORITY_STEPS, list_keys
from platform_tasks.jobs_status.model import Found, Place
from platform_tasks.keys import KOMBU_UNACKED, fair_lane_keys
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["Match", "Places", "RedisSearch", "anchor_of", "wire_text"]

CHUNK = 250
"""Messages read per Redis command inside the search script: 250 wire messages (about
400 KB) searched faster than 1,000 or 2,000 (``bench/job_status_scan.py``), as a chunk's
reply and its Lua strings then stay in the CPU's cache."""

WINDOW = 300
"""Messages read on each side of the spot the bisection of a list found (jobs published
in the same milliseconds, clocks of several publishers a little apart)."""


@dataclass(frozen=True)
class Places:
    """What the search looks at: queue names, the broker's key prefix, priority steps."""

    settings: PlatformSettings
    queues: tuple[str, ...]
    prefix: str = ""
    steps: tuple[int, ...] = PRIORITY_STEPS

    @classmethod
    def of(cls, source: PlatformCelery | PlatformSettings, extra: Iterable[str] = ()) -> Places:
        """The places of an app (its queues and transport options) or of bare settings."""
        if isinstance(source, PlatformSettings):
            names = {"default", *extra, *_console_queues(), *source.fair_queues}
            names.discard("*")
            return cls(source, tuple(sorted(names)))
        from platform_tasks.brokers.queue_latency import queues_of

        options = source.conf.broker_transport_options or {}
        names = {*queues_of(source), str(source.conf.task_default_queue or "default"), *extra}
        return cls(
            source.platform_settings,
            tuple(sorted(names)),
            str(options.get("global_keyprefix") or ""),
            tuple(options.get("priority_steps") or PRIORITY_STEPS),
        )

    def with_queues(self, names: Iterable[str]) -> Places:
        return Places(self.settings, tuple(sorted({*self.queues, *names})), self.prefix, self.steps)


def _console_queues() -> list[str]:
    configured = os.environ.get("PLATFORM_CONSOLE_QUEUES", "")
    return [name.strip() for name in configured.split(",") if name.strip()]


@dataclass
class Match:
    """One message found: the job id it carries and where it is."""

    job_id: str
    found: Found
    argsrepr: str = ""


@dataclass
class _Key:
    place: Place
    queue: str | None = None
    tenant: str | None = None


@dataclass
class RedisSearch:
    """The search over one deployment's Redis servers (clients opened on first use)."""

    places: Places
    _broker: Any = None
    _store: Any = None
    _delay_schedule: str | None = None
    _script: dict[int, Any] = field(default_factory=dict)

    @property
    def broker_is_redis(self) -> bool:
        return broker_kind(self.places.settings.effective_broker_url) == "redis"

    def unseen(self) -> list[str]:
        """What this search cannot look into, for an ``unknown`` answer's note."""
        if self.broker_is_redis:
            return []
        return ["the RabbitMQ queues (AMQP cannot be searched without taking messages)"]

    def find(self, needle: str, limit: int, *, near_ms: int | None = None) -> list[Match]:
        """Messages holding ``needle``, at most ``limit``, from every place searched.
        ``near_ms``: the job id's time, where its message should be in each list."""
        matches: list[Match] = []
        if self.broker_is_redis:
            client = self._broker_client()
            keys = self._broker_keys(client)
            matches += self._run(client, keys, needle, limit, near_ms=near_ms)
        location = delay_store_location(self.places.settings)
        if location is not None and location.kind == "rabbitmq":
            if self._store is None:
                self._store = location.connect(timeout=5, connect_timeout=5)
            keys = {location.keys.entries: _Key("delay_store")}
            matches += self._run(self._store, keys, needle, limit, location.keys.schedule)
        return matches

    def close(self) -> None:
        for client in (self._broker, self._store):
            if client is not None:
                client.close()
        self._broker = self._store = None

    def _broker_client(self) -> Any:
        if self._broker is None:
            import redis

            self._broker = redis.Redis.from_url(
                self.places.settings.effective_broker_url,
                socket_timeout=10,
                socket_connect_timeout=5,
            )
        return self._broker

    def _broker_keys(self, client: Any) -> dict[str, _Key]:
        """Every list, lane and hash to search on the broker, with what each one is."""
        keys: dict[str, _Key] = {}
        lists = [
            (queue, key)
            for queue in self.places.queues
            for key in list_keys(queue, self.places.prefix, self.places.steps)
        ]
        pipe = client.pipeline(transaction=False)
        for _, key in lists:
            pipe.lrange(fair_lane_keys(key).ring, 0, -1)
        rings = pipe.execute()
        for (queue, key), ring in zip(lists, rings, strict=True):
            keys[key] = _Key("queue", queue)
            lanes = fair_lane_keys(key)
            for raw in dict.fromkeys(ring):
                tenant = raw.decode() if isinstance(raw, bytes) else str(raw)
                keys[lanes.lane(tenant)] = _Key("lane", queue, tenant)
        keys[self.places.prefix + KOMBU_UNACKED] = _Key("fetched")
        location = delay_store_location(self.places.settings)
        if location is not None and location.kind == "redis":
            keys[location.keys.entries] = _Key("delay_store")
            self._delay_schedule = location.keys.schedule
        return keys

    def _run(
        self,
        client: Any,
        keys: dict[str, _Key],
        needle: str,
        limit: int,
        schedule: str | None = None,
        *,
        near_ms: int | None = None,
    ) -> list[Match]:
        script = self._script.get(id(client))
        if script is None:
            script = self._script[id(client)] = client.register_script(
                script_source("find_messages")
            )
        names = list(keys)
        near = "" if near_ms is None else near_ms
        flat = script(keys=names, args=[needle, anchor_of(needle), limit, CHUNK, near, WINDOW])
        matches: list[Match] = []
        delayed: list[tuple[Match, str]] = []
        for i in range(0, len(flat), 3):
            key, where, raw = (_text(flat[i]), _text(flat[i + 1]), _text(flat[i + 2]))
            match = _parse(keys[key], where, raw, self.places)
            if match is None:
                continue
            matches.append(match)
            if match.found.place == "delay_store":
                delayed.append((match, where))
        if delayed:
            schedule = schedule or self._delay_schedule
            pipe = client.pipeline(transaction=False)
            for _, entry_id in delayed:
                pipe.zscore(schedule, entry_id)
            for (match, _), score in zip(delayed, pipe.execute(), strict=True):
                match.found = _with_due(match.found, score)
        return matches


def wire_text(text: str) -> str:
    """``text`` as it is spelled inside a JSON string of a wire message (kombu writes
    ASCII JSON: a quote, a backslash or a non-ASCII letter is escaped), the form the
    search must look for."""
    return json.dumps(text)[1:-1]


def anchor_of(needle: str) -> str:
    """The part of ``needle`` the search tests every message for first: from its first
    ``=`` (a correlation id's ending), else its first ``-`` (a job id), else all of it.

    Neither character is in a base64 body, and both are rare in a message's headers, so
    ``string.find``, which runs ``memchr`` for the first character and compares from
    there, crosses most of each message in one call: a correlation search costs 0.9-1.3x
    the bare read of the messages instead of 1.7-1.9x; a job id's, the same as before
    (BENCHMARKS.md, "Job status").
    """
    for mark in ("=", "-"):
        at = needle.find(mark)
        if at >= 0:
            return needle[at:]
    return needle


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _with_due(found: Found, score: Any) -> Found:
    due = int(float(score)) if score is not None else None
    return Found(found.place, found.queue, found.tenant, found.ahead, found.headers, due)


def _parse(key: _Key, where: str, raw: str, places: Places) -> Match | None:
    """The job id and place of one found item, or ``None`` when it is not a message."""
    try:
        data = json.loads(raw)
        queue = key.queue
        if key.place == "fetched":
            message, queue = data[0], str(data[2] or "") or None
        elif key.place == "delay_store":
            message, queue = _delay_entry(data, places)
        else:
            message = data
        headers = _headers(message)
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    job_id = headers.get("id")
    if not isinstance(job_id, str):
        return None
    ahead = int(where) if key.place in ("queue", "lane") else None
    found = Found(key.place, queue, key.tenant, ahead, headers)
    return Match(job_id, found, str(headers.get("argsrepr") or ""))


def _delay_entry(data: dict[str, Any], places: Places) -> tuple[dict[str, Any], str | None]:
    if "m" in data:  # a Redis broker's entry: the list key and the wire message
        return json.loads(data["m"]), _queue_of_list(str(data["q"]), places)
    properties = data.get("p") or {}
    return {"headers": properties.get("application_headers") or {}}, str(data.get("q") or "")


def _queue_of_list(list_key: str, places: Places) -> str | None:
    for queue in places.queues:
        if list_key in list_keys(queue, places.prefix, places.steps):
            return queue
    name = list_key.removeprefix(places.prefix)
    return name.split("\x06\x16")[0] or None


def _headers(message: Any) -> dict[str, Any]:
    headers = message.get("headers") if isinstance(message, dict) else None
    return dict(headers) if isinstance(headers, dict) else {}
