"""Claims of the delay store on a real Redis: what a promoter publishing to RabbitMQ relies on.

A claimed entry stays stored and is invisible to other promoters until its lease ends;
removal takes it out for good; release makes it due again at once.
"""

from __future__ import annotations

import redis

from platform_tasks.keys import rabbitmq_delay_keys
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
