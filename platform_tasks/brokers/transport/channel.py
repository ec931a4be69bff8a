"""The platform transport's channel: an atomic fetch and one cached client.

Consuming works like stock kombu's event-loop path (a command sent on the channel's own
connection, its reply read when the socket is readable), with two differences:

* The command that takes a message is the ``transport_fetch`` script, which pops the
  message and records it as unacked in one atomic step. Stock kombu's BRPOP hands the
  message to the worker and records it afterwards, so a SIGKILL in between loses it.
* A script cannot block, so when every list is empty the channel waits with
  ``BLMOVE q q RIGHT RIGHT``: a blocking "rotate the list onto itself", which wakes up as
  soon as ``q`` has a message but leaves that message where it is. The next fetch takes
  it. Waking up never removes anything, so a crash while waiting cannot lose a message.

A queue named in ``PLATFORM_FAIR_QUEUES`` is taken with ``transport_fair_fetch``
instead, which also sorts it by tenant (``fair_lanes``).

Everything else (publishing, bindings, fanout over PUB/SUB, priorities, prefixes, TLS)
is kombu's code; this class only replaces what touches the unacked state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from queue import Empty
from time import monotonic
from typing import Any

import redis
from kombu.transport.redis import Channel as RedisChannel
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from platform_tasks.brokers.scripts import script_source
from platform_tasks.brokers.selection import sweep_interval
from platform_tasks.brokers.transport import fair_lanes, fetch_plans, restore
from platform_tasks.brokers.transport.fair_lanes import FairLanes
from platform_tasks.brokers.transport.fetch_plans import FETCH
from platform_tasks.brokers.transport.qos import QoS
from platform_tasks.errors import ConfigurationError
from platform_tasks.headers import UNREADABLE_HEADER
from platform_tasks.keys import (
    TRANSPORT_BACKOFF_STREAM,
)

logger = logging.getLogger("platform_tasks.transport")

MIN_REDIS_VERSION = (6, 2)
"""BLMOVE (the blocking wait) exists since Redis 6.2."""

WAIT = "BLMOVE"
BACKOFF = "XREAD"

FIRST_BACKOFF = 0.1
"""Seconds the consumer pauses after the first error reply in a row (doubled per reply)."""
MAX_BACKOFF = 5.0
"""Longest pause between attempts while the broker keeps answering error replies; well
under kombu's BRPOP health-check deadline, so a paused socket is never taken for dead."""

_SCRIPTS = (
    "transport_fetch",
    "transport_ack",
    "transport_append",
    "transport_restore",
    "transport_expired",
    "transport_extend",
    fair_lanes.SCRIPT,
)


class Channel(RedisChannel):
    """kombu's Redis channel with an atomic fetch, script acks and a cached client."""

    QoS = QoS

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        options = connection.client.transport_options or {}
        if options.get("ack_emulation", True) is False:
            raise ConfigurationError(
                "the platform transport needs ack emulation: ack_emulation=False makes "
                "every delivered message unrecoverable; remove the transport option or set "
                "PLATFORM_TRANSPORT=stock"
            )
        self._kombu_client: Any = None
        self._raw_client: redis.Redis | None = None
        self._scripts: dict[str, Script] = {}
        self._recorded: set[str] = set()
        self._noack_queues: set[str] = set()
        self._fetch_lists: list[tuple[str, int]] = []
        self._fetch_script = "transport_fetch"
        self._packed_fetches: dict[tuple[Any, ...], tuple[list[tuple[str, int]], str, Any]] = {}
        self.fair = FairLanes.from_transport_options(options)
        """Which consumed queues are taken fairly across tenants (``fair_lanes``)."""
        self._lanes_checked = float("-inf")
        self._hot_list: tuple[str, int] | None = None
        self._wait_next = False
        self._poll_stage = FETCH
        self._backoff = 0.0
        self._backoff_until = 0.0
        self.error_replies = 0
        """Error replies (OOM, MISCONF, READONLY, ...) met while taking messages."""
        super().__init__(connection, *args, **kwargs)
        try:
            self._check_server()
            self._load_scripts()
        except BaseException:
            self.close()
            raise

    # --- clients and scripts ----------------------------------------------------------

    @property
    def sync_client(self) -> Any:
        """The channel's one client for kombu's own commands (prefixing if configured).

        Stock kombu builds a new client object for every publish, append and ack.
        """
        if self._kombu_client is None:
            self._kombu_client = self._create_client()
        return self._kombu_client

    @property
    def raw_client(self) -> redis.Redis:
        """A client that does not prefix: the platform's commands prefix keys themselves.

        kombu's prefixing client prefixes only the first key of an EVALSHA, so scripts
        with several keys go through this one, sharing the same connection pool.
        """
        if self._raw_client is None:
            kwargs: dict[str, Any] = {"connection_pool": self.pool}
            provider = self.pool.connection_kwargs.get("credential_provider")
            if provider is not None:
                kwargs["credential_provider"] = provider
            self._raw_client = redis.Redis(**kwargs)
        return self._raw_client

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client if client else self.sync_client

    def _disconnect_pools(self) -> None:
        # The cached clients point at the pools being dropped (also after a fork).
        self._kombu_client = None
        self._raw_client = None
        super()._disconnect_pools()

    def prefixed(self, key: str) -> str:
        return f"{self.global_keyprefix}{key}"

    def _script(self, name: str) -> Script:
        script = self._scripts.get(name)
        if script is None:
            script = self.raw_client.register_script(script_source(name))
            self._scripts[name] = script
        return script

    def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run ``name`` with the unacked hash and index as KEYS[1..2], then ``keys``."""
        all_keys = [self.prefixed(self.unacked_key), self.prefixed(self.unacked_index_key)]
        all_keys.extend(keys)
        return self._script(name)(keys=all_keys, args=list(args), client=self.raw_client)

    def _load_scripts(self) -> None:
        for name in _SCRIPTS:
            self.raw_client.script_load(self._script(name).script)

    def _check_server(self) -> None:
        transport = self.connection
        if getattr(transport, "platform_server_checked", False):
            return
        version = str(self.raw_client.info("server").get("redis_version", "0"))
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if parts < MIN_REDIS_VERSION:
            raise ConfigurationError(
                f"the platform transport needs Redis >= 6.2 (BLMOVE); the broker runs "
                f"{version}: upgrade Redis or set PLATFORM_TRANSPORT=stock"
            )
        transport.platform_server_checked = True

    # --- timing -----------------------------------------------------------------------

    @property
    def restore_interval(self) -> float:
        """Seconds between visibility-timeout sweeps; never above the timeout."""
        configured = self.connection.client.transport_options.get("unacked_restore_interval")
        return sweep_interval(float(self.visibility_timeout), configured)

    # --- consuming --------------------------------------------------------------------

    def take_recorded(self, delivery_tag: str) -> bool:
        """True (once) if the fetch script already wrote this message's unacked record."""
        if delivery_tag in self._recorded:
            self._recorded.discard(delivery_tag)
            return True
        return False

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        self.fair.adopt_leftovers(self.raw_client, {queue: self._priority_keys(queue)})
        if no_ack:
            self._noack_queues.add(queue)
        else:
            self._noack_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def adopt_stranded_lanes(self, *, force: bool = False) -> bool:
        """Consume fairly any queue this channel consumes without fairness whose lanes
        hold messages; True if one was adopted now.

        Checked when consuming starts, but lanes can fill later: in a rolling deploy that
        turns fairness off, the old workers keep sorting arrivals onto lanes after the
        new ones started on an empty queue. So the worker's timer and a fetch that finds
        every list empty look again, at most every ``ADOPT_CHECK_INTERVAL`` seconds
        (``force``: now, for ``basic_get``).
        """
        now = monotonic()
        if not force and now - self._lanes_checked < fair_lanes.ADOPT_CHECK_INTERVAL:
            return False
        self._lanes_checked = now
        plain = {
            queue: self._priority_keys(queue)
            for queue in self._active_queues
            if not self._is_fair(queue) and queue not in self._expires
        }
        if not plain:
            return False
        return bool(self.fair.adopt_leftovers(self.raw_client, plain))

    def _basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super()._basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._noack_queues.discard(queue)
        return result

    def _brpop_start(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        command: list[Any] = []
        packed: Any = None
        pause = self._backoff_until - monotonic()
        if pause > 0:
            # Backing off after an error reply: a read-only blocking command that Redis
            # accepts whatever its state, so the socket stays in the event loop.
            stream = self.prefixed(TRANSPORT_BACKOFF_STREAM)
            command = [BACKOFF, "BLOCK", max(1, int(pause * 1000)), "STREAMS", stream, "$"]
            self._poll_stage = BACKOFF
            replies_within = pause
        elif self._wait_next:
            key, wait = fetch_plans.wait_plan(self, queues, timeout)
            command = [WAIT, key, key, "RIGHT", "RIGHT", wait]
            self._poll_stage = WAIT
            replies_within = wait
        else:
            packed = fetch_plans.packed_fetch(self, queues)
            self._poll_stage = FETCH
            replies_within = 0.0
        connection = self.client.connection
        self._in_poll = connection
        # kombu drops the connection when no reply came ``brpop_timeout`` plus
        # ``health_check_interval`` after this time, BRPOP's server-side timeout being
        # ``brpop_timeout``. Ours replies within ``replies_within`` (at once for a
        # fetch, 0.1 s for a short wait), so the deadline is moved to match it.
        self._brpop_sent_at = monotonic() + replies_within - self.brpop_timeout
        if packed is not None:
            connection.send_packed_command(packed)
        else:
            connection.send_command(*command)

    def _brpop_read(self, **options: Any) -> bool:
        connection = self.client.connection
        stage = self._poll_stage
        try:
            try:
                reply = self.client.parse_response(connection, stage, **options)
            except NoScriptError:
                # The server lost its script cache (restart, SCRIPT FLUSH): load and retry.
                self._load_scripts()
                raise Empty() from None
            except self.connection_errors:
                connection.disconnect()
                raise
            except redis.ResponseError as exc:
                self._met_error_reply(stage, exc)
                raise Empty() from None
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()
        if stage == BACKOFF:
            raise Empty()
        if self._backoff:
            self._backoff = 0.0
            logger.info(
                "broker accepts commands again; consuming resumes",
                extra={"event": "transport.error_replies_cleared"},
            )
        if stage == WAIT:
            self._wait_next = False
            if reply is None:
                if self._fetch_lists:
                    # Timed out: the next fetch starts with the next queue in turn.
                    self._queue_cycle.rotate(self._fetch_lists[0][0])
                # Idle: sweep for expired messages here too (throttled by time). Without
                # an event loop kombu sweeps only after a poll that saw no reply, and
                # with short waits every poll sees one.
                try:
                    self.qos.restore_visible(
                        num=self.unacked_restore_limit, interval=self.unacked_restore_throttle
                    )
                except self.connection_errors:
                    logger.debug(
                        "sweep skipped: broker connection error",
                        exc_info=True,
                        extra={"event": "transport.sweep_skipped"},
                    )
            raise Empty()
        return self._deliver_fetched(reply)

    def _met_error_reply(self, stage: str, exc: redis.ResponseError) -> None:
        """Log an error reply to the take-a-message command and back off exponentially.

        An error reply (``OOM`` under ``noeviction``, ``MISCONF`` after a failed save,
        ``READONLY`` after a failover) is a broker state, not a broken connection: the
        command had no effect (the fetch script's first write is the pop, which Redis
        either refuses or runs with the record), so no message moved. The consumer keeps
        its connection and tries again after a pause that doubles up to ``MAX_BACKOFF``.
        """
        self.error_replies += 1
        self._backoff = min(MAX_BACKOFF, self._backoff * 2 if self._backoff else FIRST_BACKOFF)
        self._backoff_until = monotonic() + self._backoff
        logger.warning(
            "broker answered an error reply to %s (%s); retrying in %.1fs",
            stage,
            exc,
            self._backoff,
            extra={
                "event": "transport.error_reply",
                "command": stage,
                "error": str(exc),
                "retry_in_seconds": self._backoff,
            },
        )

    def _deliver_fetched(self, reply: Sequence[Any]) -> bool:
        index = int(reply[0])
        if index == 0:
            # Every list is empty: before waiting, look for lanes other workers filled.
            try:
                adopted = self.adopt_stranded_lanes()
            except (*self.connection_errors, redis.ResponseError):
                adopted = False  # looked for again at the next empty fetch or timer tick
            self._wait_next = not adopted
            raise Empty()
        queue, priority = self._fetch_lists[index - 1]
        self._hot_list = (queue, priority)
        message = loads(bytes_to_str(reply[1]))
        _log_if_unreadable(message, queue)
        tag = message["properties"]["delivery_tag"]
        if queue not in self._noack_queues:
            self._recorded.add(tag)
        self._queue_cycle.rotate(queue)
        try:
            self.connection._deliver(message, queue)
        finally:
            self._recorded.discard(tag)
        return True

    def _fetch_now(self, queue: str, *, record: bool) -> dict[str, Any] | None:
        keys, flags = fetch_plans.fetch_plan(self, [queue], record=record)
        reply = self.run_script(self._fetch_script, keys, flags)
        if int(reply[0]) == 0 and self._adopt_for_get(queue):
            keys, flags = fetch_plans.fetch_plan(self, [queue], record=record)
            reply = self.run_script(self._fetch_script, keys, flags)
        self._maybe_update_queues_expire(self.sync_client, queue)
        if int(reply[0]) == 0:
            return None
        message: dict[str, Any] = loads(bytes_to_str(reply[1]))
        _log_if_unreadable(message, queue)
        return message

    def _adopt_for_get(self, queue: str) -> bool:
        """``basic_get`` found ``queue`` empty: adopt its lanes if other workers filled them."""
        if self._is_fair(queue) or queue in self._expires:
            return False
        return bool(self.fair.adopt_leftovers(self.raw_client, {queue: self._priority_keys(queue)}))

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        raw = self._fetch_now(queue, record=not no_ack)
        if raw is None:
            return None
        message = self.Message(raw, channel=self)
        if not no_ack:
            self._recorded.add(message.delivery_tag)
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str) -> dict[str, Any]:
        raw = self._fetch_now(queue, record=True)
        if raw is None:
            raise Empty()
        self._recorded.add(raw["properties"]["delivery_tag"])
        return raw

    def sort_arrivals(self) -> int:
        """Sort arrivals of the fair queues this channel consumes onto their lanes.

        Called by the worker's timer (``Transport.sort_fair_arrivals``). The fetch sorts
        too, but one batch per fetch ties sorting to the job rate: behind a burst of
        100,000, a new tenant would wait for 100 jobs to *finish*, minutes with slow
        jobs. Builds its own plan (the fetch's ``_fetch_lists`` stay untouched) and
        runs on a pool connection, never on the one a fetch may be pending on.
        """
        queues = [queue for queue in self._active_queues if self._is_fair(queue)]
        if not queues:
            return 0
        keys, args = fetch_plans.sort_plan(self, queues)
        sorted_total = 0
        for _ in range(fair_lanes.SORT_BATCHES_PER_TICK):
            moved = int(self.run_script(fair_lanes.SCRIPT, keys, args)[1])
            sorted_total += moved
            if moved < self.fair.sort_batch:
                break
        return sorted_total

    # --- queue size and purge (tenant lanes included) --------------------------------

    def _is_fair(self, queue: str) -> bool:
        """Fair if configured (or left with lanes), except a queue with ``x-expires``: such
        a queue is transient (a reply queue) and its expiry is set on its list, which a
        fair queue empties onto lanes."""
        return self.fair.is_fair(queue) and queue not in self._expires

    def _priority_keys(self, queue: str) -> list[str]:
        return [self.prefixed(self._q_for_pri(queue, pri)) for pri in self.priority_steps]

    def _size(self, queue: str) -> int:
        """Messages waiting on the queue's lists and in its tenant lanes."""
        size = int(super()._size(queue))
        return size + fair_lanes.waiting_in_lanes(self.raw_client, self._priority_keys(queue))

    def _purge(self, queue: str) -> int:
        """Empty the queue's lists and tenant lanes in one script (``purge_lanes``)."""
        return fair_lanes.purge_lanes(self.raw_client, self._priority_keys(queue))

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super()._delete(queue, *args, **kwargs)
        fair_lanes.purge_lanes(self.raw_client, self._priority_keys(queue))

    # --- restoring --------------------------------------------------------------------

    def restore_record(
        self, tag: str, record: bytes | str, *, leftmost: bool, unroutable_here: bool = False
    ) -> bool:
        """Push one unacked record back onto its queues (once); True if this call did.

        Routing (exchange lookup, priority list) is kombu's, computed here; the script
        then removes the record and pushes the message atomically. A message no queue is
        bound for any more (its queue deleted, its exchange's bindings gone) stays unacked,
        unless ``unroutable_here`` (the visibility sweep): then it goes to this channel's
        first queue marked with :data:`UNROUTABLE_HEADER`, where the worker's consumer
        dead-letters it; otherwise it would stay unacked for ever, swept again and again.
        """
        return restore.restore_record(
            self, tag, record, leftmost=leftmost, unroutable_here=unroutable_here
        )

    def extend_unacked(self, tags: Sequence[str]) -> int:
        """Refresh the unacked timestamps of ``tags`` (still recorded ones only)."""
        if not tags:
            return 0
        return int(self.run_script("transport_extend", [], list(tags)))

    def in_flight_tags(self) -> list[str]:
        """Tags of the messages this channel delivered and nobody acked yet."""
        qos = self.qos
        done = qos._dirty | qos.unsent_acks
        return [tag for tag in list(qos._delivered) if tag not in done]

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        self.qos.restore_by_tag(message.delivery_tag, leftmost=leftmost)


def _log_if_unreadable(message: dict[str, Any], queue: str) -> None:
    """Log an item the fetch script wrapped because it was no readable kombu message."""
    why = (message.get("headers") or {}).get(UNREADABLE_HEADER)
    if why is not None:
        logger.error(
            "unreadable broker message on queue %s (%s); delivered wrapped, to be dead-lettered",
            queue,
            why,
            extra={"event": "transport.message_unreadable", "queue": queue, "why": why},
        )
