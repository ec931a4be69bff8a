"""The state decided from what the stores said: one answer, in the documented order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from platform_tasks.envelope import uuid7
from platform_tasks.jobs_status.model import Facts, Found, decide, job_time, publish_order

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _letter(**values: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": 7,
        "reason": "retries_exhausted",
        "status": "pending_review",
        "created_at": NOW,
        "discard_reason": None,
    }
    return {**row, **values}


def _processed(output: object = None) -> dict[str, object]:
    return {"consumer": "billing.charge", "processed_at": NOW, "output": output}


def test_a_cancel_wins_over_its_claim_and_names_the_operation() -> None:
    facts = Facts(
        "j",
        processed=[_processed()],
        dead_letters=[
            _letter(
                reason="cancelled", status="discarded", discard_reason="cancelled by operation 12"
            )
        ],
        operation={"actor": "dora"},
    )
    status = decide(facts, NOW)
    assert status.state == "cancelled"
    assert (status.details["operation_id"], status.details["actor"]) == (12, "dora")


def test_applied_wins_over_a_leftover_running_marker_and_carries_the_output() -> None:
    facts = Facts("j", processed=[_processed({"rows": 0})], marker={"host": "w1", "pid": "4"})
    status = decide(facts, NOW)
    assert status.state == "applied"
    assert status.output == {"billing.charge": {"rows": 0}}
    assert status.to_json(with_output=False).get("output") is None


def test_a_falsy_output_is_still_recorded_output() -> None:
    assert decide(Facts("j", processed=[_processed(0)]), NOW).output == {"billing.charge": 0}
    assert decide(Facts("j", processed=[_processed()]), NOW).output is None


def test_a_pending_dead_letter_wins_over_a_stray_waiting_copy() -> None:
    facts = Facts("j", dead_letters=[_letter()], found=[Found("queue", "billing", ahead=3)])
    status = decide(facts, NOW)
    assert (status.state, status.details["dead_letter_id"]) == ("dead_lettered", 7)
    assert status.details["review_status"] == "pending_review"


def test_a_replayed_dead_letter_sends_the_job_on_to_where_it_is_now() -> None:
    replayed = _letter(status="replayed")
    waiting = Facts("j", dead_letters=[replayed], found=[Found("queue", "billing", ahead=0)])
    assert decide(waiting, NOW).state == "waiting"
    lost = decide(Facts("j", dead_letters=[replayed]), NOW)
    assert lost.state == "dead_lettered"
    assert lost.details["review_status"] == "replayed"


def test_running_shows_the_marker_and_its_progress() -> None:
    marker = {
        "host": "w1",
        "pid": "41",
        "attempt": "2",
        "consumer": "c",
        "queue": "q",
        "since": "1765108800000",
        "done": "250",
        "total": "1000",
        "note": "rows",
        "at": "1765108801000",
    }
    details = decide(Facts("j", marker=marker), NOW).details
    assert (details["pid"], details["attempt"]) == (41, 2)
    assert details["progress"] == {
        "done": 250,
        "total": 1000,
        "note": "rows",
        "at": "2025-12-07T12:00:01+00:00",
    }


def test_waiting_says_queue_lane_position_wait_and_pause() -> None:
    ready = NOW.timestamp() - 90
    found = Found("lane", "billing", "acme", 4, {"platform_published_at": ready})
    paused = {"billing": {"operation_id": 3, "actor": "ops", "since": "x"}}
    details = decide(Facts("j", found=[found], paused=paused), NOW).details
    assert (details["queue"], details["tenant"], details["ahead"]) == ("billing", "acme", 4)
    assert details["waited_seconds"] == 90
    assert details["paused"]["operation_id"] == 3


def test_delayed_names_why() -> None:
    due = int(NOW.timestamp() * 1000)

    def reason(headers: dict[str, object]) -> dict[str, object]:
        return decide(
            Facts("j", found=[Found("delay_store", "q", None, None, headers, due)])
        ).details

    retry = reason({"platform_attempt": 3, "platform_delay_reason": {"why": "retry", "max": 5}})
    assert (retry["reason"], retry["retry"]) == ("retry", {"attempt": 3, "of": 5})
    cap = reason({"platform_delay_reason": {"why": "concurrency_cap", "detail": "concurrency_cap"}})
    assert cap["reason"] == "concurrency_cap"
    throttle = reason({"platform_delay_reason": {"why": "throttle", "detail": "throttle"}})
    assert throttle["reason"] == "throttle"
    scheduled = reason({"platform_attempt": 1})
    assert (scheduled["reason"], scheduled["due_at"]) == ("scheduled", NOW.isoformat())


def test_an_outbox_row_is_delayed_until_relayed() -> None:
    row = {"id": 5, "queue": "q", "created_at": NOW, "due_ms": None}
    details = decide(Facts("j", outbox=[row]), NOW).details
    assert (details["reason"], details["outbox_id"]) == ("outbox", 5)


def test_unknown_tells_never_seen_from_expired_by_the_ids_time() -> None:
    fresh = str(uuid7())
    assert decide(Facts(fresh, keep_days=30)).details["reason"] == "never_seen"
    old = job_time(fresh)
    assert old is not None
    expired = decide(Facts(fresh, keep_days=30), old + timedelta(days=31)).details
    assert expired["reason"] == "expired"
    assert "30 days" in expired["note"]
    rabbit = decide(Facts(fresh, unseen=["the RabbitMQ queues"])).details
    assert "cannot see into the RabbitMQ queues" in rabbit["note"]


def test_publish_order_puts_time_ordered_ids_first_in_order() -> None:
    first = "01a24f93-0000-7000-8000-000000000009"  # 1 ms before the second
    second = "01a24f93-0001-7000-8000-000000000001"
    foreign = "00000000-0000-4000-8000-000000000000"  # a UUIDv4: no time, listed after
    assert sorted([foreign, second, first], key=publish_order) == [first, second, foreign]
