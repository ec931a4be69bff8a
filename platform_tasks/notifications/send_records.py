"""What a notification job has sent, request by request, kept in Redis beside its job id.

A job whose messages need several provider requests (more than ``max_batch`` emails, a
one-message-per-request adapter, a tenant bucket smaller than the job) can be refused
between two of them: a token, a 429, a quota pause. The job's transaction rolls back on
that :class:`~platform_tasks.errors.Throttled`, so the job itself cannot remember that
request 0 went out; this record does, and the next run resumes at the first request not
answered. Without it every run started again at request 0: a job refused at request 1
every time never finished, and once the provider had forgotten request 0's
``Idempotency-Key`` (Resend: 24 h), or for a provider without keys, each run sent request
0 again.

Per request ``n`` the record holds ``t<n>``, the Redis time it was first tried (written
before the request leaves), and ``d<n>``, the provider's answer: ids of the messages it
sent and the ones it refused one by one (``{"i": [ids], "r": [[index, message]]}``). A request
tried but never answered (a timeout after the provider had accepted it) is safe to try
again under its key only while the provider still knows the key; after
:data:`KEY_TRUSTED_MS` it is not sent again blind (see
:class:`~platform_tasks.notifications.dispatch.Dispatcher`).

A job of more than one request also keeps its rendered messages (``plan``): the run that
resumes it sends the requests still unsent from what was rendered when the first one went
out, so a render that changed since (a timestamp, a re-ordered query) cannot send a
recipient twice or another body under a key already used. A one-request job stores no
plan: its only request is either answered or sent again under its key, and the provider
refuses a different body under that key (409, a dead letter).

The record lives in the platform's Redis (append-only, no eviction: the same durability as
the delay store that holds the job while it waits), for :data:`RECORD_TTL_MS` while the
job is unfinished and :data:`FINISHED_TTL_MS` after its last request was answered: from
the commit on, the job's idempotency row keeps it from running again.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from platform_tasks.brokers.scripts import script_source
from platform_tasks.brokers.server_time import reply_ms
from platform_tasks.keys import SendRecordKeys, send_record_keys
from platform_tasks.notifications.message import EmailMessage
from platform_tasks.notifications.provider import RejectedItem, SendResult

__all__ = [
    "FINISHED_TTL_MS",
    "KEY_TRUSTED_MS",
    "RECORD_TTL_MS",
    "SendProgress",
    "SendRecords",
    "decode_plan",
    "encode_plan",
]

RECORD_TTL_MS = 35 * 24 * 3600 * 1000
"""An unfinished job's record outlives the longest wait the rails impose (a monthly quota
pause: up to a month)."""

FINISHED_TTL_MS = 48 * 3600 * 1000
"""Kept after the last request was answered, longer than the provider keeps its keys: a
worker killed between the answer and the commit leaves a job that runs again and must
find every request answered."""

KEY_TRUSTED_MS = 23 * 3600 * 1000
"""How long after a request's first try its ``Idempotency-Key`` is trusted to make a
repeat harmless: Resend keeps keys 24 hours; one hour is left for clocks and queues."""


@dataclass(frozen=True)
class SendProgress:
    """A job's record as read at Redis time ``now_ms``."""

    now_ms: int
    started: dict[int, int] = field(default_factory=dict)
    """Request number → the Redis time (ms) it was first tried."""
    done: dict[int, SendResult] = field(default_factory=dict)
    """Request number → the provider's answer: ids of the messages sent, those refused."""
    plan: bytes | None = None

    @property
    def resumed(self) -> bool:
        """Whether an earlier run tried any request of this job."""
        return bool(self.started or self.done)


def encode_plan(messages: Sequence[Any]) -> bytes | None:
    """The rendered messages as compressed JSON; ``None`` when one is not JSON-able.

    An adapter's own message type that JSON cannot carry is not stored: such a job
    resumes with what its render returns again (which must then be deterministic).
    """
    items: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, EmailMessage):
            items.append({"email": message.model_dump(mode="json", exclude_none=True)})
        else:
            items.append({"json": message})
    try:
        text = json.dumps(items, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return zlib.compress(text.encode(), 6)


def decode_plan(plan: bytes) -> list[Any]:
    """The messages :func:`encode_plan` stored, as the adapter gets them."""
    items = json.loads(zlib.decompress(plan))
    return [
        EmailMessage.model_validate(item["email"]) if "email" in item else item["json"]
        for item in items
    ]


class SendRecords:
    """Reads and writes send records in the Redis given (the rate limits' client)."""

    def __init__(
        self, client: Any, *, profile: str, clock_ms: Callable[[], int] | None = None
    ) -> None:
        self.client = client
        self.keys: SendRecordKeys = send_record_keys(profile)
        self._clock_ms = clock_ms
        self._start = client.register_script(script_source("send_record_start"))

    def progress(self, job_id: object) -> SendProgress:
        """The job's record and Redis's time, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self.keys.job(str(job_id)))
        time_reply, raw = pipe.execute()
        now = self._clock_ms() if self._clock_ms is not None else reply_ms(time_reply)
        started: dict[int, int] = {}
        done: dict[int, SendResult] = {}
        plan: bytes | None = None
        for name, value in cast(dict[bytes, bytes], raw).items():
            key = name.decode()
            if key == "plan":
                plan = value
            elif key.startswith("t"):
                started[int(key[1:])] = int(value)
            elif key.startswith("d"):
                answer = json.loads(value)
                done[int(key[1:])] = SendResult(
                    ids=[str(i) for i in answer["i"]],
                    rejected=[RejectedItem(int(i), str(m)) for i, m in answer["r"]],
                )
        return SendProgress(now, started, done, plan)

    def start(self, job_id: object, number: int, plan: bytes | None = None) -> int:
        """Note that request ``number`` is about to be sent; returns its first try (ms)."""
        now = "" if self._clock_ms is None else str(self._clock_ms())
        return int(
            self._start(
                keys=[self.keys.job(str(job_id))],
                args=[number, RECORD_TTL_MS, plan or b"", now],
            )
        )

    def sent(self, job_id: object, number: int, result: SendResult, *, last: bool) -> None:
        """Request ``number`` was answered with ``result``; ``last``: the job's last one."""
        key = self.keys.job(str(job_id))
        answer = {"i": list(result.ids), "r": [[r.index, r.message] for r in result.rejected]}
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, f"d{number}", json.dumps(answer, separators=(",", ":")))
        pipe.pexpire(key, FINISHED_TTL_MS if last else RECORD_TTL_MS)
        pipe.execute()

    def forget_try(self, job_id: object, number: int) -> None:
        """Drop request ``number``'s unanswered try, so a replay of the job sends it."""
        self.client.hdel(self.keys.job(str(job_id)), f"t{number}")
