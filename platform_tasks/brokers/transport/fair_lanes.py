"""Fair dequeue by tenant within a queue: the platform transport's tenant lanes.

Without it one queue is one FIFO list: a tenant that publishes 100,000 jobs delays every
other tenant's jobs on that queue until its backlog drains. A fair queue keeps its list
(every publisher still pushes there: kombu, the delay store's promotion, a stock
producer) as an *arrival* list; the fetch script (``transport_fair_fetch.lua``) moves
arrivals onto one lane per tenant, keeps a ring of the tenants with waiting messages,
and takes the next message from the ring's head, rotating it after ``weight`` messages.
Sorting and taking happen in the same atomic script that records the message as
unacked, so the transport's guarantees (nothing lost on SIGKILL, visibility refresh,
restore) are unchanged: a message is always on the arrival list, on a lane, or in the
unacked hash.

The tenant is the ``platform_tenant`` header, which ``publish`` and ``schedule`` set from
the envelope's ``tenant_id``; a message without it (a plain ``apply_async``) waits in
the default lane, which takes its turn in the ring like any tenant.

Fairness is opt-in per queue (``PLATFORM_FAIR_QUEUES``), not on by default: the queue's
own list no longer holds its backlog, so tools reading ``LLEN <queue>`` (``celery
inspect``, Flower, queue-length autoscalers) undercount, and a worker without fairness
(an older release, ``PLATFORM_TRANSPORT=stock``) does not see the lanes. A platform
worker consuming a queue whose ring exists consumes it fairly even when the setting no
longer names it: it looks when it starts consuming, when it finds its lists empty and
every :data:`ADOPT_CHECK_INTERVAL` seconds, so lanes filled by older workers after it
started (a rolling deploy turning fairness off) are drained too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from platform_tasks.brokers.scripts import script_source
from platform_tasks.keys import fair_lane_keys
from platform_tasks.settings.tenant_weights import parse_tenant_weights

logger = logging.getLogger("platform_tasks.transport")

ALL_QUEUES = "*"
"""``PLATFORM_FAIR_QUEUES=*``: every queue the worker consumes is fair."""

SCRIPT = "transport_fair_fetch"
PURGE_SCRIPT = "transport_fair_purge"

DEFAULT_SORT_BATCH = 1000
"""Arrivals one fetch moves onto lanes at most (transport option ``fair_sort_batch``). A
backlog of N messages is sorted within N / 1000 fetches (a tenant behind 100,000 jobs
waits about 100 jobs). Sorting reads the tenant header without decoding the JSON and
moves each tenant's run with one ``LPUSH``: about 4 µs per message on an idle Redis, so a
fetch that sorts 1,000 holds Redis about 4 ms (measured with ``SLOWLOG``)."""


@dataclass(frozen=True)
class FetchList:
    """One list the fetch script looks at: a queue at one priority step."""

    list_key: str
    """The queue list's Redis key, prefix included."""
    queue: str
    priority: int
    record: bool
    fair: bool


@dataclass
class FairLanes:
    """Which queues of a channel are fair, and the fetch script's arguments for them."""

    queues: frozenset[str]
    weights: Mapping[str, int] = field(default_factory=dict)
    sort_batch: int = DEFAULT_SORT_BATCH
    adopted: set[str] = field(default_factory=set)
    """Queues not named in the setting whose ring exists: consumed fairly until drained."""

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any]) -> FairLanes:
        queues = options.get("fair_queues") or ()
        if isinstance(queues, str):
            queues = [q.strip() for q in queues.split(",") if q.strip()]
        weights = options.get("tenant_weights") or {}
        if isinstance(weights, str):
            weights = parse_tenant_weights(weights)
        batch = int(options.get("fair_sort_batch") or DEFAULT_SORT_BATCH)
        return cls(frozenset(queues), dict(weights), max(1, batch))

    def is_fair(self, queue: str) -> bool:
        return ALL_QUEUES in self.queues or queue in self.queues or queue in self.adopted

    def adopt_leftovers(self, client: Any, queues: Mapping[str, Sequence[str]]) -> list[str]:
        """Consume fairly each of ``queues`` (queue name -> its list keys) that is not fair
        but whose lanes hold messages (fairness turned off while they waited, or older
        workers still sorting onto them): they would wait for ever otherwise. One round
        trip; returns the queues adopted now."""
        candidates = [queue for queue in queues if not self.is_fair(queue)]
        if not candidates:
            return []
        pipe = client.pipeline(transaction=False)
        for queue in candidates:
            pipe.exists(*(fair_lane_keys(key).ring for key in queues[queue]))
        adopted = [queue for queue, found in zip(candidates, pipe.execute(), strict=True) if found]
        for queue in adopted:
            self.adopted.add(queue)
            logger.warning(
                "queue %s has messages in tenant lanes but PLATFORM_FAIR_QUEUES does not "
                "name it; consuming it fairly until they are drained",
                queue,
                extra={"event": "transport.fair_lanes_adopted", "queue": queue},
            )
        return adopted

    def plan(
        self, lists: Sequence[FetchList], legacy_key: str, *, mode: str = "fetch"
    ) -> tuple[list[str], list[str]]:
        """KEYS (after the two unacked keys) and ARGV of ``transport_fair_fetch.lua``."""
        keys = [legacy_key]
        args = [str(self.sort_batch), mode, str(len(self.weights))]
        for tenant, weight in self.weights.items():
            args.extend((tenant, str(weight)))
        for item in lists:
            lane = fair_lane_keys(item.list_key)
            keys.extend(
                (item.list_key, lane.ring, lane.turn, lane.waiting, lane.lengths, lane.heads)
            )
            args.extend(
                (
                    "1" if item.record else "0",
                    item.queue,
                    str(item.priority),
                    "fair" if item.fair else "plain",
                    lane.lane_prefix,
                )
            )
        return keys, args


SORT_INTERVAL = 0.1
"""Seconds between the worker's sorts of arrivals (its event loop's timer)."""
ADOPT_CHECK_INTERVAL = 1.0
"""Seconds between a consumer's checks for lanes on the queues it takes without fairness
(one ``EXISTS`` per queue): the longest a message sorted there by another worker waits
to be noticed."""
SORT_BATCHES_PER_TICK = 5
"""Sort calls one tick makes at most while arrivals remain (each at most
``DEFAULT_SORT_BATCH`` per list, a few ms of Redis): a 100,000-job burst is on lanes
within about 2 s however slow its jobs are."""


def waiting_in_lanes(client: Any, list_keys: Sequence[str]) -> int:
    """Messages waiting in the tenant lanes of ``list_keys`` (not counting the lists)."""
    if not list_keys:
        return 0
    values = client.mget([fair_lane_keys(key).waiting for key in list_keys])
    return sum(max(0, int(v)) for v in values if v is not None)


def purge_lanes(client: Any, list_keys: Sequence[str]) -> int:
    """Empty ``list_keys`` and their tenant lanes in one script (``transport_fair_purge``);
    returns how many messages they held.

    One atomic step: a worker's sort running between a separate read of the ring and the
    deletes could put a new tenant on the ring, and that tenant's lane would outlive it.
    """
    if not list_keys:
        return 0
    keys: list[str] = []
    prefixes: list[str] = []
    for list_key in list_keys:
        lane = fair_lane_keys(list_key)
        keys.extend((list_key, lane.ring, lane.turn, lane.waiting, lane.lengths, lane.heads))
        prefixes.append(lane.lane_prefix)
    script = client.register_script(script_source(PURGE_SCRIPT))
    return int(script(keys=keys, args=prefixes, client=client))


def waiting_by_tenant(client: Any, list_keys: Sequence[str], limit: int) -> dict[str, int]:
    """Messages waiting per tenant in the lanes of ``list_keys``, the ``limit`` largest.

    The fetch script keeps each list's lane lengths in a sorted set, so this reads the
    ``limit`` largest of each list (one ``ZREVRANGE``) and, for a tenant found in one
    list, its length in the others (one ``ZMSCORE``): two round trips whatever the number
    of tenants. With several priority lists a tenant outside every list's top ``limit``
    can be missed though its sum is larger; with one list (the usual case) it is exact.
    """
    if not list_keys:
        return {}
    sets = [fair_lane_keys(key).lengths for key in list_keys]
    pipe = client.pipeline(transaction=False)
    for lengths in sets:
        pipe.zrevrange(lengths, 0, limit - 1, withscores=True)
    tops = pipe.execute()
    tenants = list(dict.fromkeys(_text(t) for top in tops for t, _ in top))
    if not tenants:
        return {}
    counts = dict.fromkeys(tenants, 0)
    if len(sets) == 1:
        for tenant, size in tops[0]:
            counts[_text(tenant)] = int(size)
    else:
        pipe = client.pipeline(transaction=False)
        for lengths in sets:
            pipe.zmscore(lengths, tenants)
        for scores in pipe.execute():
            for tenant, size in zip(tenants, scores, strict=True):
                counts[tenant] += int(size or 0)
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
    return dict(top)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
