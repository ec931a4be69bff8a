"""A notification load against real workers and a Resend-like server, and what it measured.

Used by the throughput end-to-end test and by ``bench/notifications_throughput.py``:
marketing is published as blasts up front (the backlog), transactional receipts are
published at a steady pace meanwhile (a load generator's pacing, not synchronisation),
and the server's request log gives the rate the provider saw, per 10 s window.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from platform_tasks.notifications import publish_blast
from platform_tasks.testing.servers import wait_until

WINDOW_SECONDS = 10.0


@dataclass
class LoadResult:
    """What one load run measured (times in seconds on the test process's monotonic clock)."""

    requests: int
    emails: int
    expected_emails: int
    duplicates: int
    window_rates: list[float]
    mixed_windows: int
    """How many of ``window_rates`` (the first ones) end before the last transactional
    request: the windows where both rails had work. The rest are the tail, where only
    marketing is left."""
    transactional_latencies: list[float]
    paused_seconds: float
    pauses: int
    dead_letters: int
    redis_commands: int
    provider_429s: int
    limiter_calls: int
    """Rate-limit script calls: one per delivery of a job (first ones and reruns after a
    throttle or a failed attempt, counted from the workers' "job throttled" and "retry
    scheduled" lines; no other failure is injected) plus none for the learned-limit
    write-backs, which happen once."""
    throttles: int
    """Deliveries that ended "job throttled" (rolled back and rescheduled)."""
    throttled_receipts: int
    """Of ``throttles``, those of transactional receipts (the rest are blast jobs)."""
    duration: float
    notes: list[str] = field(default_factory=list)

    def latency(self, quantile: float) -> float:
        values = sorted(self.transactional_latencies)
        if not values:
            return float("nan")
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[int(quantile * 100) - 1]


def _paused_seconds(logs: str) -> tuple[float, int]:
    resumed = [float(x) for x in re.findall(r"marketing resumed on \w+ after ([\d.]+) s", logs)]
    return sum(resumed), logs.count("marketing paused on ")


def run_load(
    rig: Any,
    redis_url: str,
    *,
    transactional: int,
    marketing: int,
    chunk_size: int,
    transactional_per_second: float,
    warmup: float = 2.0,
    timeout: float = 600.0,
    campaign: str = "load",
) -> LoadResult:
    """Publish the load, wait until every email arrived, and measure."""
    client = redis.Redis.from_url(redis_url)
    commands_before = int(client.info("stats")["total_commands_processed"])
    start = time.monotonic()
    marketing_ids = publish_blast(
        rig.port,
        kind="notify.newsletter",
        tenant_id="acme",
        campaign_id=campaign,
        recipients=(f"{campaign}-m{n}@example.org" for n in range(marketing)),
        chunk_size=chunk_size,
    )
    published: dict[str, float] = {}
    step = 1.0 / transactional_per_second if transactional_per_second > 0 else 0.0
    for n in range(transactional):
        due = start + n * step
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing of the load generator
        tenant = f"t{n % 5}"
        payload = {
            "tenant_id": tenant,
            "kind": "notify.receipt",
            "data": {"email": f"{campaign}-{tenant}-{n}@example.org", "n": n},
        }
        job = rig.port.publish("notif.email.transactional", payload)
        published[f"{job}:0"] = time.monotonic()
    expected = marketing + transactional
    wait_until(
        lambda: len(rig.server.snapshot()[1]) >= expected,
        timeout=timeout,
        interval=0.2,
        message=f"{expected} emails",
    )
    duration = time.monotonic() - start
    requests, emails = rig.server.snapshot()
    commands = int(client.info("stats")["total_commands_processed"]) - commands_before
    client.close()
    seen: dict[tuple[str | None, str], int] = {}
    for email in emails:
        for to in email.to:
            seen[(email.idempotency_key, to)] = seen.get((email.idempotency_key, to), 0) + 1
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    arrival: dict[str, float] = {}
    for email in emails:
        if email.idempotency_key in published and email.idempotency_key not in arrival:
            arrival[email.idempotency_key] = email.at
    latencies = [arrival[k] - published[k] for k in published if k in arrival]
    marketing_keys = {f"{job}:0" for job in marketing_ids}
    email_requests = [r for r in requests if r.path in ("/emails", "/emails/batch")]
    marketing_requests = [r for r in email_requests if r.idempotency_key in marketing_keys]
    rates: list[float] = []
    mixed = 0
    transactional_end = max(
        (r.at for r in email_requests if r.idempotency_key in published), default=0.0
    )
    if email_requests and marketing_requests:
        first = email_requests[0].at + warmup
        backlog_end = max(r.at for r in marketing_requests)
        times = sorted(r.at for r in email_requests)
        t = first
        while t + WINDOW_SECONDS <= backlog_end:
            count = sum(1 for x in times if t <= x < t + WINDOW_SECONDS)
            rates.append(count / WINDOW_SECONDS)
            if t + WINDOW_SECONDS <= transactional_end:
                mixed += 1
            t += 1.0
    logs = rig.logs()
    paused, pauses = _paused_seconds(logs)
    throttles = logs.count("job throttled")
    throttled_receipts = len(re.findall(r"job throttled[^\n]*kind=notify\.receipt", logs))
    limiter_calls = transactional + len(marketing_ids) + logs.count("retry scheduled") + throttles
    return LoadResult(
        requests=len(email_requests),
        emails=len(seen),
        expected_emails=expected,
        duplicates=duplicates,
        window_rates=rates,
        mixed_windows=mixed,
        transactional_latencies=latencies,
        paused_seconds=paused,
        pauses=pauses,
        dead_letters=rig.dead_letters(),
        redis_commands=commands,
        provider_429s=sum(1 for r in email_requests if r.status == 429),
        limiter_calls=limiter_calls,
        throttles=throttles,
        throttled_receipts=throttled_receipts,
        duration=duration,
    )
