"""The single owner of every Redis key name platform-tasks writes.

Keys of one concern share a ``{hash tag}`` so that a Lua script touching them runs on
one Redis Cluster slot. Changing a name here is a data migration: the old keys are
orphaned, so names are versioned (``v1``) rather than edited.
"""

from __future__ import annotations

import json
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
    ``store`` names the store: ``delays`` holds Redis-list entries (a Redis broker),
    ``rabbitmq-delays`` AMQP messages (a RabbitMQ broker with
    ``PLATFORM_RABBITMQ_DELAYS=delay_store``), so the two encodings never meet.
    """

    namespace: str
    store: str = "delays"

    @property
    def schedule(self) -> str:
        return f"{{{self.namespace}:{self.store}}}:v1:schedule"

    @property
    def entries(self) -> str:
        return f"{{{self.namespace}:{self.store}}}:v1:entries"

    @property
    def delivered_counter(self) -> str:
        return f"{{{self.namespace}:{self.store}}}:v1:delivered"

    @property
    def returns(self) -> str:
        """Hash from entry id to how many times RabbitMQ returned its message as
        unroutable (the promoter backs off on it and dead-letters it after a bound)."""
        return f"{{{self.namespace}:{self.store}}}:v1:returns"

    @property
    def claimed(self) -> str:
        """Set of the entry ids a promoter has claimed to publish elsewhere (RabbitMQ): such
        an entry's data may already be on its way, so a debounce publish must not replace
        it (it stores a new job instead); removed with the entry."""
        return f"{{{self.namespace}:{self.store}}}:v1:claimed"


def delay_keys(profile: str) -> DelayKeys:
    return DelayKeys(base_namespace(profile))


def rabbitmq_delay_keys(profile: str) -> DelayKeys:
    """The delay store whose entries a promoter publishes to RabbitMQ."""
    return DelayKeys(base_namespace(profile), store="rabbitmq-delays")


# --- scheduled jobs (issue 4) -------------------------------------------------------


def jobs_namespace(*, app_name: str, profile: str, mode: str, namespace: str | None = None) -> str:
    """Namespace of the scheduled-job keys: ``platform:<app>:<profile>:<mode>``.

    Replicas of one deployment (same app package, profile and runtime mode) derive the
    same value with no manual setting; ``namespace`` overrides it for extra isolation.
    """
    if namespace:
        return namespace
    return f"{ROOT}:{app_name}:{profile}:{mode}"


@dataclass(frozen=True)
class JobKeys:
    """Keys of one scheduled job, all under one ``{hash tag}`` (one Cluster slot).

    ``marker`` holds the last admitted point (ms since the epoch, no TTL: it survives
    completion and lease expiry); ``lease`` holds the running lease's owner token with a
    TTL. ``prefix`` (setting ``jobs_key_prefix``) is prepended verbatim.
    """

    namespace: str
    job: str
    prefix: str = ""

    @property
    def tag(self) -> str:
        return f"{self.prefix}{{{self.namespace}:job:{self.job}}}"

    @property
    def marker(self) -> str:
        return f"{self.tag}:v1:marker"

    @property
    def lease(self) -> str:
        return f"{self.tag}:v1:lease"

    @property
    def ran(self) -> str:
        """The newest point a worker took to run (django-celery-beat triggers): a
        redelivered trigger of a point not newer is not run again."""
        return f"{self.tag}:v1:ran"


# --- consumer deliveries (issue 3) ----------------------------------------------------


@dataclass(frozen=True)
class DeliveryKeys:
    """Keys counting how often a job was delivered to one consumer.

    One small hash per ``(consumer, job_id)``, created only for a job that failed, was
    redelivered or was dead-lettered, with fields ``f`` (attempts whose handler raised),
    ``c`` (redeliveries: attempts whose worker died), ``done`` (the job was dead-lettered),
    ``gen`` (the dead letter whose replay restarted the count) and ``t`` (the hard time
    limit, in seconds, that stopped a delivery whose redelivery has not settled it yet).
    Deleted when the job is applied, expired otherwise. ``v2``: v1 counted every delivery
    in one field ``n``.
    """

    namespace: str

    def deliveries(self, consumer: str, job_id: str) -> str:
        return f"{self.namespace}:consumer:v2:deliveries:{consumer}:{job_id}"


def delivery_keys(profile: str) -> DeliveryKeys:
    return DeliveryKeys(base_namespace(profile))


# --- Redis transport -------------------------------------------------------------------
# The broker's queue lists, binding tables and unacked hash/index keep kombu's names (and
# kombu's ``global_keyprefix``) so stock and platform workers can share one broker. Only
# the keys below are the platform transport's own; the transport prefixes them with the
# broker's ``global_keyprefix`` like every other broker key.

TRANSPORT_LEGACY_QUARANTINE = "platform:transport:v1:unreadable"
"""List where earlier versions set aside broker messages that were no readable kombu
messages (it grew without bound). The fetch script now delivers such a message wrapped,
to be dead-lettered, and drains this list the same way, one item per fetch."""


# --- django-celery-beat periodic tasks (issue 15) ---------------------------------------


def django_beat_namespace(*, app_name: str, profile: str) -> str:
    """Namespace of the keys ``LeaseDatabaseScheduler`` admits periodic tasks under:
    ``platform:<app>:<profile>:django-celery-beat``, apart from the file jobs' keys."""
    return f"{ROOT}:{app_name}:{profile}:django-celery-beat"


def periodic_task_job(pk: int) -> str:
    """The job name of django-celery-beat periodic task ``pk`` inside that namespace
    (:class:`JobKeys` builds the marker and lease keys from it). The primary key, not
    the task's name: names are editable in Django admin."""
    return f"periodic-task-{pk}"


# --- notification rate limits (issue 13) ---------------------------------------------


@dataclass(frozen=True)
class RateLimitKeys:
    """Rate-limit keys of one provider, all under one ``{hash tag}`` (one Cluster slot).

    ``bucket`` is the provider's token bucket (hash: ``tokens``, ``ts`` of the last
    refill in ms, ``until`` before which nobody may send after a 429, ``learned`` rate per
    ms the provider's headers reported and ``learned_until``, ``paused_until`` and
    ``pause_reason`` of a quota pause, ``state`` present while any of those may be in
    force, ``next_t``/``next_m`` the next slot given to a refused transactional/marketing
    caller, ``next_w`` the next slot given to a transactional send waiting in place);
    ``tenant(t)`` is tenant ``t``'s bucket of messages for this provider
    (``tokens``, ``ts``, ``exp`` the ms its expiry was set to, ``next_*``; expires when
    full);
    ``pause_alerted`` exists while a pause lasts, so the pause alerts once.
    """

    namespace: str
    provider: str

    @property
    def tag(self) -> str:
        return f"{{{self.namespace}:ratelimit:{self.provider}}}"

    @property
    def bucket(self) -> str:
        return f"{self.tag}:v1:bucket"

    @property
    def pause_alerted(self) -> str:
        return f"{self.tag}:v1:pause_alerted"

    def tenant(self, tenant_id: str) -> str:
        return f"{self.tag}:v1:tenant:{tenant_id}"


def rate_limit_keys(profile: str, provider: str) -> RateLimitKeys:
    return RateLimitKeys(base_namespace(profile), provider)


@dataclass(frozen=True)
class SendRecordKeys:
    """The send record of notification jobs: which provider requests a job has sent.

    ``job(job_id)`` is a hash per job: ``t<n>`` the Redis time in ms request ``n`` was
    first tried, ``d<n>`` the provider's answer (ids, refused emails) once it was
    answered, ``plan`` the job's rendered messages (zlib-compressed JSON, jobs of more than
    one request only). One key per job, so no script spans two slots.
    """

    namespace: str

    def job(self, job_id: str) -> str:
        return f"{self.namespace}:notifications:v1:sent:{job_id}"


def send_record_keys(profile: str) -> SendRecordKeys:
    return SendRecordKeys(base_namespace(profile))


TRANSPORT_BACKOFF_STREAM = "platform:transport:v1:backoff"
"""A stream nobody writes: the transport's back-off after a broker error reply blocks on
``XREAD BLOCK <ms> STREAMS <this> $`` (read-only, so Redis accepts it when out of memory,
``MISCONF`` or a read-only replica), keeping the consumer's socket in the event loop."""


@dataclass(frozen=True)
class OperationKeys:
    """Keys of operator actions: ``paused`` is a hash from queue name to the pause (the
    operation id, who, since when) that every worker polls."""

    namespace: str

    @property
    def paused(self) -> str:
        return f"{{{self.namespace}:operations}}:v1:paused"


def operation_keys(profile: str) -> OperationKeys:
    return OperationKeys(base_namespace(profile))


TENANT_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
"""What a tenant id may hold (the envelope's rule). Tenant ids become parts of Redis keys
(fair lanes, per-key limits), so the rule lives beside the key names."""


FAIR_SEPARATOR = "\x06\x16"
"""Separator of the fair-lane keys derived from a queue list's key: kombu's own priority
separator, which no queue name contains, so a lane key never collides with a queue."""


@dataclass(frozen=True)
class FairLaneKeys:
    """Keys of one fair queue list (one queue at one priority step).

    ``list_key`` is the queue's own Redis list (prefix included), where every publisher
    still pushes: the arrival list. ``lane(t)`` is the list of tenant ``t``'s waiting
    messages (``t`` empty: messages without a tenant, the default lane); ``ring`` the
    list of tenants whose lane holds messages, in turn order; ``turn`` how many messages
    the ring's head gave in its current turn; ``waiting`` how many messages wait in all
    lanes, so the queue's depth is ``LLEN list_key + GET waiting`` without a scan;
    ``lengths`` a sorted set of the ring's tenants by lane length and ``heads`` one of
    tenants by the ready time of their lane's oldest message, kept by the scripts so the
    queue gauges read the largest lanes and the oldest job with one command each. Keys
    derive from the list key (no hash tag: kombu's Redis transport is single-node).
    """

    list_key: str

    @property
    def ring(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.ring"

    @property
    def turn(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.turn"

    @property
    def waiting(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.waiting"

    @property
    def lengths(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.lengths"

    @property
    def heads(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.heads"

    @property
    def lane_prefix(self) -> str:
        return f"{self.list_key}{FAIR_SEPARATOR}fair.v1.lane{FAIR_SEPARATOR}"

    def lane(self, tenant: str) -> str:
        return f"{self.lane_prefix}{tenant}"


def fair_lane_keys(list_key: str) -> FairLaneKeys:
    return FairLaneKeys(list_key)


# --- per-key limits (platform_tasks.limits) -------------------------------------------
# A concurrency key's leases are one sorted set; a throttle's two buckets share one hash
# tag (the take script touches both, so they sit in one Redis Cluster slot); a unique
# publish key shares the delay store's hash tag, because debounce replaces a stored entry
# in the same script that reads the key.


def concurrency_key(profile: str, task: str, key: str) -> str:
    """Sorted set of the running jobs of ``(task, key)``: member job id, score the lease's
    expiry in ms (Redis ``TIME``)."""
    return f"{base_namespace(profile)}:limits:v1:concurrency:{task}:{key}"


def concurrency_waiting_key(profile: str, task: str) -> str:
    """Sorted set of the jobs of ``task`` waiting on a cap: member the JSON array ``[job
    id, queue, key]`` (:func:`cap_waiting_member`), score the time (ms) they are due back.
    ``v2``: v1 members were the job id alone, so the runnable gauge could not tell which
    key's cap (and which queue) a job due back waits on."""
    return f"{base_namespace(profile)}:limits:v2:cap_waiting:{task}"


def cap_waiting_member(job_id: str, queue: str, key: str) -> str:
    """The member of :func:`concurrency_waiting_key` for one job (compact JSON, so the
    same job refused again on the same queue and key is the same member)."""
    return json.dumps([job_id, queue, key], separators=(",", ":"))


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


# --- job status (platform_tasks.jobs_status) ------------------------------------------


def running_key(profile: str, job_id: str) -> str:
    """Hash of a job a worker is running: host, pid, attempt, consumer, queue, since (ms),
    and the progress it last reported (``done``, ``total``, ``note``, ``at``). Written once
    the handler ran half a second, with a TTL of the job's time limit, deleted after it ended
    (:mod:`platform_tasks.jobs_status.running`): a killed worker's marker expires."""
    return f"{base_namespace(profile)}:jobs:v1:running:{job_id}"


KOMBU_UNACKED = "unacked"
"""kombu's Redis hash of the messages a worker fetched and has not acknowledged (delivery
tag to ``[message, exchange, routing key]``), under the broker's ``global_keyprefix``:
where a job a worker holds (prefetched or running) is, on a Redis broker."""
