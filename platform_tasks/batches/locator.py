"""Where a batch's unfinished children are: in the delay store, or running on a worker.

PostgreSQL knows which children have not ended, not where they are. This locator looks
in the two places that can say so without reading the queues message by message:

* the delay store (a retry waiting, a delayed publish): its entries carry the job id in
  their headers, so one ``HSCAN`` over the entries finds the children among them. It reads
  at most :data:`MAX_DELAY_ENTRIES` entries; a bigger store, or RabbitMQ's native delays
  (no store to read), is named in :attr:`WorkerAndDelayLocator.unknown`;
* the workers: Celery's ``inspect().active()`` lists the jobs each worker is running (the
  job id is the Celery task id). Workers that do not answer within the timeout are not
  counted, and "workers" is named as unknown when none answered.

A child found in neither is counted as waiting (on its queue, or on its way there).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from platform_tasks.brokers.delay_location import delay_store_location
from platform_tasks.settings import PlatformSettings, without_secrets

__all__ = ["MAX_DELAY_ENTRIES", "WorkerAndDelayLocator"]

logger = logging.getLogger(__name__)

MAX_DELAY_ENTRIES = 200_000
"""Delay-store entries read per lookup; a store beyond it is reported as not fully read."""
SCAN_COUNT = 1000
INSPECT_TIMEOUT_SECONDS = 1.0
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class WorkerAndDelayLocator:
    """A :class:`~platform_tasks.batches.status.ChildLocator` over the delay store of
    ``settings`` and the workers of ``app`` (none: the delay store only)."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        app: Any = None,
        inspect_timeout: float = INSPECT_TIMEOUT_SECONDS,
        max_delay_entries: int = MAX_DELAY_ENTRIES,
    ) -> None:
        self.settings = settings
        self.app = app
        self.inspect_timeout = inspect_timeout
        self.max_delay_entries = max_delay_entries
        self._unknown: list[str] = []

    @property
    def unknown(self) -> tuple[str, ...]:
        return tuple(self._unknown)

    def locate(self, job_ids: Sequence[str]) -> Mapping[str, str]:
        self._unknown = []
        wanted = {job_id.lower() for job_id in job_ids}
        found = {job_id: "delayed" for job_id in self._delayed(wanted)}
        found.update({job_id: "running" for job_id in self._running(wanted)})
        return found

    def _delayed(self, wanted: set[str]) -> set[str]:
        location = delay_store_location(self.settings)
        if location is None:
            self._unknown.append("RabbitMQ delayed messages")
            return set()
        found: set[str] = set()
        try:
            client = location.connect(timeout=10.0, connect_timeout=5.0)
        except Exception as exc:
            self._failed("delay store", exc)
            return found
        try:
            entries = client.hscan_iter(location.keys.entries, count=SCAN_COUNT)
            for read, (_entry_id, entry) in enumerate(entries, start=1):
                if read > self.max_delay_entries:
                    self._unknown.append(f"delay store beyond {self.max_delay_entries} entries")
                    break
                raw = entry if isinstance(entry, bytes) else str(entry).encode()
                for match in _UUID.findall(raw):
                    job_id = match.decode()
                    if job_id in wanted:
                        found.add(job_id)
        except Exception as exc:
            self._failed("delay store", exc)
        finally:
            client.close()
        return found

    def _running(self, wanted: set[str]) -> set[str]:
        if self.app is None:
            self._unknown.append("workers")
            return set()
        try:
            active = self.app.control.inspect(timeout=self.inspect_timeout).active()
        except Exception as exc:
            self._failed("workers", exc)
            return set()
        if not active:
            self._unknown.append("workers (none answered)")
            return set()
        running = {
            str(request.get("id", "")).lower()
            for requests in active.values()
            for request in requests or []
        }
        return running & wanted

    def _failed(self, place: str, exc: BaseException) -> None:
        self._unknown.append(place)
        logger.warning(
            "could not look for batch children in the %s: %s",
            place,
            without_secrets(str(exc), self.settings.redis_url, self.settings.broker_url),
            extra={"event": "batches.locate_failed", "place": place},
        )
