"""The Redis delay promoter wakes when the earliest waiting entry is due, not at the next poll.

Rate-limited sends rescheduled at staggered slots must come back at their slot: promoted
in poll-interval batches they meet sends that arrived meanwhile and are refused again.
The poll interval here is 2 s so that "promoted at its due time" and "promoted at the
next poll" cannot be confused; all times are the Redis server clock, which also decides
due-ness.
"""

from __future__ import annotations

from typing import Any

import redis

from platform_tasks.keys import delay_keys
from platform_tasks.publishing.delay_promoter import DelayPromoter
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings

POLL_INTERVAL_SECONDS = 2.0
DUE_AFTER_MS = 120
LATE_BOUND_MS = 1000
"""Half the poll interval: a promotion at the next poll is at least 1,880 ms late."""


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_an_entry_due_shortly_after_a_pass_is_promoted_at_its_due_time(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url, profile="test", delay_poll_interval_seconds=POLL_INTERVAL_SECONDS
    )
    store = DelayStore(redis_client, delay_keys("test"))
    for attempt in range(5):
        # "first" is due at once: seeing it on its list says the first pass has run. "soon"
        # is due 120 ms later; if it is still stored then, that pass left it waiting.
        start_ms = _redis_ms(redis_client)
        due_ms = start_ms + DUE_AFTER_MS
        store.add(f"first-{attempt}", start_ms - 1, "first", "{}")
        store.add(f"soon-{attempt}", due_ms, "soon", "{}")
        promoter = DelayPromoter(settings)
        promoter.start()
        try:
            assert redis_client.blpop(["first"], timeout=30) is not None, "no first pass"
            if redis_client.zscore(store.keys.schedule, f"soon-{attempt}") is None:
                # the machine was slow enough that the first pass came after "soon" was
                # due and moved both: that says nothing about waking, so try again
                redis_client.delete("soon")
                continue
            popped = redis_client.blpop(["soon"], timeout=30)
            promoted_ms = _redis_ms(redis_client)
        finally:
            promoter.stop()
        assert popped is not None, "the entry was never promoted"
        late_ms = promoted_ms - due_ms
        assert 0 <= late_ms < LATE_BOUND_MS, (
            f"promoted {late_ms} ms after it was due (poll interval {POLL_INTERVAL_SECONDS} s)"
        )
        assert store.pending() == 0
        return
    raise AssertionError("every first pass came after the second entry was due")


def test_the_promote_script_reports_when_the_earliest_entry_left_is_due(
    redis_client: redis.Redis,
) -> None:
    store = DelayStore(redis_client, delay_keys("test"))
    assert store.promote_due().next_due_in_ms is None, "an empty store has nothing to wait for"
    now_ms = _redis_ms(redis_client)
    store.add("due", now_ms - 1, "q", "{}")
    store.add("later", now_ms + 60_000, "q", "{}")
    result = store.promote_due()
    assert result.moved == 1 and not result.more_due
    assert result.next_due_in_ms is not None
    # judged by the clock the script read: at most 60 s, and the test took well under 30
    assert 30_000 < result.next_due_in_ms <= 60_000
    store.add("due-1", now_ms - 2, "q", "{}")
    store.add("due-2", now_ms - 1, "q", "{}")
    full = store.promote_due(limit=1)
    assert full.moved == 1 and full.more_due
    assert full.next_due_in_ms == 0, "one is still due: the batch was full"


class _CountingConnection(redis.Connection):
    """A real connection that counts what it sends: one send is one round trip."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


def test_an_idle_pass_is_one_round_trip(redis_url: str, redis_client: redis.Redis) -> None:
    """Waking for the next due entry reads it inside the promote script: an idle pass
    still costs one round trip, the promotion itself."""
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=_CountingConnection)
    client = redis.Redis(connection_pool=pool)
    try:
        store = DelayStore(client, delay_keys("test"))
        promoter = DelayPromoter(settings)
        store.add("later", _redis_ms(redis_client) + 60_000, "q", "{}")
        promoter.promote_pass(store)  # connects and loads the script on first use
        before = _CountingConnection.sends
        moved, wait = promoter.promote_pass(store)
        sent = _CountingConnection.sends - before
    finally:
        client.close()
        pool.disconnect()
    assert (moved, wait) == (0, settings.delay_poll_interval_seconds)
    assert sent == 1
