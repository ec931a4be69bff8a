"""Pure rules of the rails: queue names, blast chunking and ids, hysteresis, quota resets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from platform_tasks.notifications.blast_recipients import recipient_identity, recipient_key
from platform_tasks.notifications.blasts import blast_job_id, publish_blast
from platform_tasks.notifications.dispatch import idempotency_key, quota_reset_seconds
from platform_tasks.notifications.marketing_yield import YieldState
from platform_tasks.notifications.rails import notification_queue, rail_queues
from platform_tasks.settings import PlatformSettings


def test_queue_names() -> None:
    assert notification_queue("email", "transactional", channels=["email"]) == (
        "notif.email.transactional"
    )
    assert rail_queues(["email", "sms"]) == [
        "notif.email.transactional",
        "notif.email.marketing",
        "notif.sms.transactional",
        "notif.sms.marketing",
    ]
    with pytest.raises(ValueError, match="channel 'push' is not configured"):
        notification_queue("push", "marketing", channels=["email"])
    with pytest.raises(ValueError, match="unknown rail 'bulk'"):
        notification_queue("email", "bulk", channels=["email"])


def test_queue_names_default_to_the_configured_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATFORM_NOTIFICATION_CHANNELS", "email,sms")
    assert notification_queue("sms", "marketing") == "notif.sms.marketing"


class RecordingPort:
    """Stands in for QueuePort: records each publish and when it happened."""

    def __init__(self) -> None:
        self.settings = PlatformSettings.build()
        self.published: list[tuple[str, dict[str, Any], int]] = []
        self.pulled = 0

    def publish(self, queue: str, payload: dict[str, Any], *, tx: Any) -> uuid.UUID:
        assert tx is None, "a blast publishes at once, even from a handler"
        self.published.append((queue, payload, self.pulled))
        return uuid.UUID(payload["job_id"])


def test_blast_chunks_a_stream_with_derived_ids() -> None:
    port = RecordingPort()

    def recipients() -> Iterator[str]:
        for n in range(250):
            port.pulled += 1
            yield f"r{n}@example.org"

    ids = publish_blast(
        port,
        kind="shop.newsletter",
        tenant_id="acme",
        campaign_id="spring",
        recipients=recipients(),
        data={"template": "t1"},
    )
    assert [len(p["data"]["recipients"]) for _, p, _ in port.published] == [100, 100, 50]
    assert {q for q, _, _ in port.published} == {"notif.email.marketing"}
    assert [pulled for _, _, pulled in port.published] == [100, 200, 250]  # streamed
    assert port.published[0][1]["data"]["template"] == "t1"
    assert all(i.version == 7 for i in ids)
    again = publish_blast(
        RecordingPort(),
        kind="shop.newsletter",
        tenant_id="acme",
        campaign_id="spring",
        recipients=[f"r{n}@example.org" for n in range(250)],
    )
    assert again == ids  # the same chunks: the same jobs
    other = publish_blast(
        RecordingPort(),
        kind="shop.newsletter",
        tenant_id="acme",
        campaign_id="spring",
        recipients=[f"r{n}@example.org" for n in range(1, 251)],
    )
    assert set(other).isdisjoint(ids)  # other recipients in every chunk: other jobs
    assert blast_job_id("acme", "spring", ["a", "b"]) == blast_job_id("acme", "spring", ["b", "a"])
    assert blast_job_id("acme", "spring", ["a"]) != blast_job_id("globex", "spring", ["a"])
    assert blast_job_id("acme", "spring", ["a"]) != blast_job_id("acme", "summer", ["a"])
    assert blast_job_id("acme", "spring", ["a"]) != blast_job_id("acme", "spring", ["a", "b"])
    with pytest.raises(ValueError, match="campaign_id must be a non-empty string"):
        publish_blast(port, kind="a.b", tenant_id="t", campaign_id=7, recipients=[])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_in_flight"):
        publish_blast(
            port, kind="a.b", tenant_id="t", campaign_id="c", recipients=[], max_in_flight=0
        )
    with pytest.raises(ValueError, match="chunk_size"):
        publish_blast(
            port, kind="a.b", tenant_id="t", campaign_id="c", recipients=[], chunk_size=101
        )


def test_blast_chunks_hold_distinct_recipients_in_canonical_order() -> None:
    port = RecordingPort()
    publish_blast(
        port,
        kind="shop.newsletter",
        tenant_id="acme",
        campaign_id="spring",
        recipients=["b@x.org", " B@X.org", "a@x.org", "c@x.org", "A@x.org", "d@x.org"],
        chunk_size=2,
    )
    chunks = [p["data"]["recipients"] for _, p, _ in port.published]
    # twice in one chunk: kept once; twice across chunks: the consumer's claim sends once
    assert chunks == [["a@x.org", "b@x.org"], ["A@x.org", "c@x.org"], ["d@x.org"]]
    assert [p["data"]["chunk"] for _, p, _ in port.published] == [0, 1, 2]


def test_recipient_identity_is_normalised() -> None:
    assert recipient_identity("  Ann@Example.ORG\n") == "ann@example.org"
    assert recipient_identity("e\u0301@x.org") == recipient_identity("\u00e9@x.org")  # NFC
    assert recipient_key("Ann@example.org") == recipient_key("ann@example.org ")
    assert len(recipient_key("ann@example.org")) == 16
    assert recipient_identity({"to": "a", "id": 1}) == recipient_identity({"id": 1, "to": "a"})


def test_yield_hysteresis() -> None:
    state = YieldState("email", pause_depth=100, resume_depth=10)
    assert state.decide(100) is None
    assert state.decide(101) == "pause"
    state.paused_at = 0.0
    assert [state.decide(d) for d in (500, 50, 10)] == [None, None, None]
    assert state.decide(9) == "resume"
    state.paused_at = None
    # transactional sends already refused and waiting for provider tokens
    assert state.decide(0, transactional_wait=1.5) == "pause"
    state.paused_at = 0.0
    assert state.decide(0, transactional_wait=0.5) is None
    assert state.decide(0, transactional_wait=0.1) == "resume"


def test_quota_resets_at_utc_midnight_or_month_start() -> None:
    now = datetime(2026, 12, 31, 23, 0, tzinfo=UTC)
    assert quota_reset_seconds("daily_quota_exceeded", now) == 3600
    assert quota_reset_seconds("monthly_quota_exceeded", now) == 3600
    assert quota_reset_seconds("monthly_quota_exceeded", datetime(2026, 2, 1, tzinfo=UTC)) == (
        28 * 86400
    )


def test_idempotency_key_is_stable() -> None:
    job = uuid.UUID("01936d2e-0000-7000-8000-000000000000")
    assert idempotency_key(job, 0) == idempotency_key(job, 0) == f"{job}:0"
