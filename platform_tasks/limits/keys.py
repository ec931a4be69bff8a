"""Redis key names of the per-key limits (one module owns them, like ``platform_tasks.keys``).

A concurrency key's leases are one sorted set; a throttle's two buckets share one hash tag
(the take script touches both, so they must sit in one Redis Cluster slot); a unique
publish key shares the delay store's hash tag, because debounce replaces a stored entry
in the same script that reads the key. Names are versioned (``v1``): renaming is a data
migration.
"""

from __future__ import annotations

from platform_tasks.keys import base_namespace


def concurrency_key(profile: str, task: str, key: str) -> str:
    """Sorted set of the running jobs of ``(task, key)``: member job id, score the lease's
    expiry in ms (Redis ``TIME``)."""
    return f"{base_namespace(profile)}:limits:v1:concurrency:{task}:{key}"


def concurrency_waiting_key(profile: str, task: str) -> str:
    """Sorted set of the jobs of ``task`` waiting on a cap: member job id, score the time
    (ms) they are due back."""
    return f"{base_namespace(profile)}:limits:v1:cap_waiting:{task}"


def throttle_tag(profile: str, task: str) -> str:
    return f"{{{base_namespace(profile)}:limits:throttle:{task}}}"


def throttle_total_bucket(profile: str, task: str) -> str:
    """The task-wide bucket (``throttle_total``)."""
    return f"{throttle_tag(profile, task)}:v1:total"


def throttle_key_bucket(profile: str, task: str, key: str) -> str:
    """The bucket of one key (``throttle``)."""
    return f"{throttle_tag(profile, task)}:v1:key:{key}"


def unique_key(namespace: str, store: str, key: str) -> str:
    """The lock of one unique publish key, in the delay store's slot."""
    return f"{{{namespace}:{store}}}:v1:unique:{key}"
