"""What the channel asks Redis for when it takes a message: the plans.

A plan is the lists a fetch reads, in kombu's BRPOP order (each queue at each priority
step), and the fetch script's KEYS and ARGV for them; on a fair queue it is
``transport_fair_fetch``'s (``fair_lanes``). The fetch command is packed once per plan
and cached on the channel; the idle wait's plan is the one list it blocks on. Kept apart
from the channel's event-loop code, which only sends and reads what these build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from platform_tasks.brokers.transport import fair_lanes
from platform_tasks.brokers.transport.fair_lanes import FetchList
from platform_tasks.keys import TRANSPORT_LEGACY_QUARANTINE

if TYPE_CHECKING:
    from platform_tasks.brokers.transport.channel import Channel

FETCH = "EVALSHA"
"""The command of a fetch (the fetch script run by its SHA); also the poll stage's name."""

MULTI_LIST_WAIT = 0.1
"""Seconds one wait blocks when the channel consumes several lists.

BLMOVE blocks on one list (the one that last delivered a message). A message landing on
another list (another queue, another priority step) is noticed at the next fetch, so
with several lists the wait is kept this short; with exactly one list it is
``brpop_timeout`` (1 s), since that list's push wakes the wait at once."""

PACKED_FETCHES_KEPT = 64
"""Packed fetch commands a channel keeps (one per queue order and consume state)."""


def fetch_plan(
    channel: Channel, queues: Sequence[str], *, record: bool
) -> tuple[list[str], list[str]]:
    """(queue, priority) of each list in consumption order (kombu's BRPOP order) and
    the script's KEYS and ARGV for them: per list a record flag, then the queue names,
    then the priority steps (an unreadable item is wrapped with its queue and step).
    When a queue is fair, the plan is ``transport_fair_fetch``'s (``fair_lanes``)."""
    channel._fetch_lists = [(q, pri) for pri in channel.priority_steps for q in queues]
    if any(channel._is_fair(queue) for queue in queues):
        channel._fetch_script = fair_lanes.SCRIPT
        lists = [
            FetchList(
                list_key=channel.prefixed(channel._q_for_pri(queue, pri)),
                queue=queue,
                priority=pri,
                record=record and queue not in channel._noack_queues,
                fair=channel._is_fair(queue),
            )
            for queue, pri in channel._fetch_lists
        ]
        return channel.fair.plan(lists, channel.prefixed(TRANSPORT_LEGACY_QUARANTINE))
    channel._fetch_script = "transport_fetch"
    keys = [channel.prefixed(TRANSPORT_LEGACY_QUARANTINE)]
    flags: list[str] = []
    for queue, pri in channel._fetch_lists:
        keys.append(channel.prefixed(channel._q_for_pri(queue, pri)))
        flags.append("1" if record and queue not in channel._noack_queues else "0")
    names = [queue for queue, _ in channel._fetch_lists]
    steps = [str(pri) for _, pri in channel._fetch_lists]
    return keys, [*flags, *names, *steps]


def packed_fetch(channel: Channel, queues: Sequence[str]) -> Any:
    """The fetch command for ``queues``, packed once per plan and then reused.

    The command names every list (a queue at each priority step, and on a fair queue
    its ring and counters): with four queues that is 150 arguments, and packing them
    for every message cost the worker's event loop more than the script costs Redis
    (``bench/fair_dispatch.py``). A plan changes only with the queue order, the
    no-ack and fair sets and the queues' expiry, which make the cache key.
    """
    cache_key = (
        tuple(queues),
        frozenset(channel._noack_queues),
        frozenset(channel.fair.adopted),
        frozenset(channel._expires),
    )
    cached = channel._packed_fetches.get(cache_key)
    if cached is not None:
        channel._fetch_lists, channel._fetch_script, packed = cached
        return packed
    keys, flags = fetch_plan(channel, queues, record=True)
    unacked = [channel.prefixed(channel.unacked_key), channel.prefixed(channel.unacked_index_key)]
    sha = channel._script(channel._fetch_script).sha
    packed = channel.client.connection.pack_command(
        FETCH, sha, len(keys) + 2, *unacked, *keys, *flags
    )
    if len(channel._packed_fetches) >= PACKED_FETCHES_KEPT:
        channel._packed_fetches.clear()
    channel._packed_fetches[cache_key] = (list(channel._fetch_lists), channel._fetch_script, packed)
    return packed


def wait_plan(channel: Channel, queues: Sequence[str], timeout: float) -> tuple[str, float]:
    """The list the idle wait blocks on, and for how long.

    It blocks on the list that delivered the last message (where the next one most
    likely lands), else on the default-priority list of the queue next in turn. A
    push onto that list wakes it at once; a push onto any other list is seen at the
    next fetch, so with several lists the wait is at most ``MULTI_LIST_WAIT``.
    """
    hot = channel._hot_list
    if hot is None or hot[0] not in queues:
        hot = (queues[0], channel.default_priority)
    lists = len(queues) * len(channel.priority_steps)
    wait = timeout or 0
    if lists > 1:
        wait = min(wait or MULTI_LIST_WAIT, MULTI_LIST_WAIT)
    return channel.prefixed(channel._q_for_pri(*hot)), wait


def sort_plan(channel: Channel, queues: Sequence[str]) -> tuple[list[str], list[str]]:
    """The sort-only plan of the fair ``queues``: built apart from the fetch's, so the
    channel's ``_fetch_lists`` stay untouched while a fetch may be pending."""
    lists = [
        FetchList(channel.prefixed(channel._q_for_pri(queue, pri)), queue, pri, False, True)
        for pri in channel.priority_steps
        for queue in queues
    ]
    return channel.fair.plan(lists, channel.prefixed(TRANSPORT_LEGACY_QUARANTINE), mode="sort")
