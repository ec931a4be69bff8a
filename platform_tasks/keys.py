"""The single owner of every Redis key name platform-tasks writes.

Keys of one concern share a ``{hash tag}`` so that a Lua script touching them runs on
one Redis Cluster slot. Changing a name here is a data migration: the old keys are
orphaned, so names are versioned (``v1``) rather than edited.
"""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "platform"


def base_namespace(profile: str) -> str:
    """Namespace shared by every process of one deployment profile."""
    return f"{ROOT}:{profile}"


@dataclass(frozen=True)
class DelayKeys:
    """Keys of the durable delay store.

    ``schedule`` is a sorted set of entry ids scored by due time in milliseconds;
    ``entries`` a hash from entry id to the encoded entry (target list key and the exact
    wire message). One hash tag, so the promotion script touches a single slot.
    """

    namespace: str

    @property
    def schedule(self) -> str:
        return f"{{{self.namespace}:delays}}:v1:schedule"

    @property
    def entries(self) -> str:
        return f"{{{self.namespace}:delays}}:v1:entries"

    @property
    def delivered_counter(self) -> str:
        return f"{{{self.namespace}:delays}}:v1:delivered"


def delay_keys(profile: str) -> DelayKeys:
    return DelayKeys(base_namespace(profile))
