"""Claims of the delay store on a real Redis: what a promoter publishing to RabbitMQ relies on.

A claimed entry stays stored and is invisible to other promoters until its lease ends;
removal takes it out for good; release makes it due again at once.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.limits.unique import UniqueLocks, UniquePublish
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.testing.servers import wait_until


def store(client: redis.Redis) -> DelayStore:
    return DelayStore(client, rabbitmq_delay_keys("test"))


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_claim_hides_the_entry_until_its_lease_ends(redis_client: redis.Redis) -> None:
    first, second = store(redis_client), store(redis_client)
    first.add_encoded("e1", now_ms(redis_client) - 1, '{"m": 1}')
    first.add_encoded("later", now_ms(redis_client) + 3_600_000, '{"m": 2}')
    claim = first.claim_due(10, lease_ms=500)
    assert claim.entries == [("e1", b'{"m": 1}')]
    assert claim.next_due_in_ms is not None and claim.next_due_in_ms <= 500
    assert second.claim_due(10, lease_ms=500).entries == [], "leased to the first promoter"
    assert redis_client.hexists(first.keys.entries, "e1"), "still stored while leased"
    # the first promoter died without removing it: the entry comes back after the lease
    wait_until(
        lambda: second.claim_due(10, lease_ms=60_000).entries == [("e1", b'{"m": 1}')],
        timeout=30,
        message="entry claimable again after the lease",
    )
    assert second.remove(["e1"]) == 1
    assert second.pending() == 1 and not redis_client.hexists(second.keys.entries, "e1")
    assert first.remove(["e1"]) == 0, "a late removal of a removed entry changes nothing"


def test_a_released_entry_is_due_again_at_once(redis_client: redis.Redis) -> None:
    s = store(redis_client)
    s.add_encoded("e1", now_ms(redis_client) - 1, "{}")
    assert len(s.claim_due(10, lease_ms=3_600_000).entries) == 1
    assert s.claim_due(10, lease_ms=3_600_000).entries == []
    s.release(["e1"])
    assert [e for e, _ in s.claim_due(10, lease_ms=3_600_000).entries] == ["e1"]
    s.remove(["e1"])
    s.release(["e1"])  # released after another promoter removed it: not re-added
    assert s.pending() == 0


def test_a_debounce_replaces_a_waiting_entry_but_never_one_a_promoter_claimed(
    redis_client: redis.Redis,
) -> None:
    """Once claimed, an entry's data may be on the broker under the waiting job's id (even
    when released unconfirmed): a debounce then stores a new job, never new data the
    removal would drop or the consumer would absorb as a duplicate of the id."""
    s = store(redis_client)
    locks = UniqueLocks(redis_client, s.keys)
    debounce = UniquePublish("k", 60_000, "debounce")

    def entry(n: int) -> Callable[[str], str]:
        return lambda job: f'{{"job": "{job}", "n": {n}}}'

    due = now_ms(redis_client) - 1
    assert locks.store(debounce, "job-1", "e1", due, 0, entry(1)) == "job-1"
    assert locks.store(debounce, "job-2", "e2", due, 0, entry(2)) == "job-1", "replaced"
    assert s.claim_due(10, lease_ms=3_600_000).entries == [("e1", b'{"job": "job-1", "n": 2}')]
    assert locks.store(debounce, "job-3", "e3", due, 0, entry(3)) == "job-3", "claimed: new job"
    s.release(["e1"])  # not confirmed: published again as it is, at least once
    assert locks.store(debounce, "job-4", "e4", due, 0, entry(4)) == "job-3", "e3 replaced"
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall(s.keys.entries).items()}
    assert stored == {"e1": '{"job": "job-1", "n": 2}', "e3": '{"job": "job-3", "n": 4}'}
    assert s.remove(["e1", "e3"]) == 2
    assert redis_client.scard(s.keys.claimed) == 0, "the claim marks leave with the entries"


def test_a_full_batch_says_more_are_due(redis_client: redis.Redis) -> None:
    s = store(redis_client)
    due = now_ms(redis_client) - 1
    s.add_many_encoded([(f"e{i}", due, "{}") for i in range(5)])
    first = s.claim_due(3, lease_ms=60_000)
    assert len(first.entries) == 3 and first.more_due
    rest = s.claim_due(3, lease_ms=60_000)
    assert len(rest.entries) == 2 and not rest.more_due
    assert {e for e, _ in first.entries} | {e for e, _ in rest.entries} == {
        f"e{i}" for i in range(5)
    }
