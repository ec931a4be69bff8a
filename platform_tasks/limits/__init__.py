"""Per-key limits for every PlatformTask: concurrency caps, throttles, unique publish.

- ``concurrency_key=`` / ``max_concurrency=``: at most N jobs of a key run at once across
  all workers (:mod:`~platform_tasks.limits.concurrency`);
- ``throttle_key=`` / ``throttle=`` (and ``throttle_total=``): token buckets shared by all
  workers (:mod:`~platform_tasks.limits.throttle`);
- ``QueuePort.publish(..., unique_key=, unique_for=, unique_mode=)``: one waiting job per
  key (:mod:`~platform_tasks.limits.unique`).

Over a limit a job waits in the delay store with no attempt spent; nothing is dropped.
See ``docs/limits.md``.
"""

from __future__ import annotations

from platform_tasks.limits.options import LIMIT_OPTIONS, LimitSpec, Rate

__all__ = ["LIMIT_OPTIONS", "LimitSpec", "Rate"]
