"""Start-up validation of beat and workers, and the Redis Cluster run of admission."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from platform_tasks.brokers.redis_client import ManagedRedis, build_redis
from platform_tasks.errors import JobDefinitionError, JobStartupError, UnsafeRedisError
from platform_tasks.jobs.leases import AdmissionOutcome, AdmissionRequest
from platform_tasks.jobs.runtime import TEST, start_jobs
from platform_tasks.keys import JobKeys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import free_port
from tests.integration.jobs.conftest import RECORDING_JOB
from tests.support.processes import CELERY, platform_env
from tests.support.servers import MAX_CLUSTER_PORT, RedisClusterServers

REPO = Path(__file__).resolve().parents[3]


def one_job(jobs_dir, url: str, schedule: str = "interval=timedelta(minutes=1)") -> Path:
    return jobs_dir({"tick.py": RECORDING_JOB.format(url=url, schedule=schedule)})


def test_unreachable_redis_is_refused_when_a_job_is_active(jobs_dir) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings = PlatformSettings.build(redis_url=dead, jobs_dir=one_job(jobs_dir, dead))
    with pytest.raises(JobStartupError, match="PLATFORM_REDIS_URL"):
        start_jobs(settings, app_name="a", role="beat")


def test_no_redis_needed_for_empty_or_all_disabled(jobs_dir, tmp_path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    empty = tmp_path / "empty"
    empty.mkdir()
    runtime = start_jobs(
        PlatformSettings.build(redis_url=dead, jobs_dir=empty), app_name="a", role="beat"
    )
    assert runtime.leases is None
    disabled = one_job(jobs_dir, dead, "interval=timedelta(minutes=1), enabled=False")
    runtime = start_jobs(
        PlatformSettings.build(redis_url=dead, jobs_dir=disabled), app_name="a", role="worker"
    )
    assert runtime.leases is None and len(runtime.jobs) == 1


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_evicting_redis_is_refused(jobs_dir, server_factory, policy: str) -> None:
    server = server_factory.redis(maxmemory_policy=policy)
    settings = PlatformSettings.build(redis_url=server.url, jobs_dir=one_job(jobs_dir, server.url))
    with pytest.raises(UnsafeRedisError, match=policy):
        start_jobs(settings, app_name="a", role="beat")


def test_test_mode_schedules_nothing(jobs_dir, redis_url) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, jobs_dir=one_job(jobs_dir, redis_url))
    runtime = start_jobs(settings, app_name="a", mode=TEST, role="beat")
    assert len(runtime.jobs) == 0 and runtime.leases is None


def test_owned_client_closed_passed_in_client_kept(jobs_dir, redis_url) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, jobs_dir=one_job(jobs_dir, redis_url))
    mine = redis.Redis.from_url(redis_url)
    runtime = start_jobs(settings, app_name="a", client=mine, role="beat")
    runtime.close()
    assert runtime.redis is not None and runtime.redis.owned is False
    assert mine.ping()
    owned = start_jobs(settings, app_name="a", role="beat")
    assert owned.redis is not None and owned.redis.owned is True
    owned.close()
    mine.close()


def test_namespace_is_generated_and_overridable(jobs_dir, redis_url) -> None:
    folder = one_job(jobs_dir, redis_url)
    settings = PlatformSettings.build(redis_url=redis_url, jobs_dir=folder, profile="prod")
    assert start_jobs(settings, app_name="shop", role="beat").namespace == "platform:shop:prod:live"
    custom = PlatformSettings.build(
        redis_url=redis_url, jobs_dir=folder, jobs_namespace="iso", jobs_key_prefix="p:"
    )
    runtime = start_jobs(custom, app_name="shop", role="beat")
    assert (
        runtime.leases is not None and runtime.leases.keys("x").marker == "p:{iso:job:x}:v1:marker"
    )
    runtime.close()


def _run_celery(kind: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [CELERY, "-A", "tests.apps.jobs_app", kind, "--loglevel", "INFO"]
    if kind == "worker":
        argv += ["-P", "solo", "--without-mingle", "--without-gossip"]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("kind", ["beat", "worker"])
def test_real_beat_and_worker_refuse_a_bad_job_file(jobs_dir, redis_url, kind: str) -> None:
    folder = one_job(jobs_dir, redis_url, "cron='0 0 30 2 *'")
    env = platform_env(
        redis_url=redis_url, database_url=None, extra={"PLATFORM_JOBS_DIR": str(folder)}
    )
    result = _run_celery(kind, env)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "tick.py" in output and "'cron'" in output
    assert "ready." not in output


def test_real_worker_refuses_evicting_redis(jobs_dir, server_factory) -> None:
    server = server_factory.redis(maxmemory_policy="allkeys-lru")
    env = platform_env(
        redis_url=server.url,
        database_url=None,
        extra={"PLATFORM_JOBS_DIR": str(one_job(jobs_dir, server.url))},
    )
    result = _run_celery("worker", env)
    assert result.returncode != 0
    assert "maxmemory-policy allkeys-lru" in result.stdout + result.stderr


def test_admission_on_a_real_three_node_cluster(tmp_path, jobs_dir) -> None:
    cluster = RedisClusterServers(tmp_path / "cluster")
    assert all(server.port <= MAX_CLUSTER_PORT for server in cluster.servers)  # bus: port+10000
    try:
        cluster.start()
        settings = PlatformSettings.build(
            redis_url=cluster.url, redis_cluster=True, jobs_dir=one_job(jobs_dir, cluster.url)
        )
        client = build_redis(settings)
        assert isinstance(client, RedisCluster)
        runtime = start_jobs(settings, app_name="a", client=client, role="beat")
        leases = runtime.leases
        assert leases is not None
        slots = {client.keyslot(JobKeys("ns", f"job{i}").marker) for i in range(30)}
        assert len(slots) > 1  # jobs spread over the cluster...
        with redis.Redis(port=cluster.servers[0].port) as node:
            now = int(node.time()[0]) * 1000
        # One pipeline over every node (scripts not loaded yet: NOSCRIPT, load, resend).
        batch = [
            AdmissionRequest(f"batch{i}", now - 10, now + 60_000, f"t{i}", 5000) for i in range(30)
        ]
        assert [a.outcome for a in leases.admit_many(batch)] == (  # type: ignore[union-attr]
            [AdmissionOutcome.ADMITTED] * 30
        )
        assert [a.outcome for a in leases.admit_many(batch)] == (  # type: ignore[union-attr]
            [AdmissionOutcome.DUPLICATE] * 30
        )
        assert leases.release_many([(f"batch{i}", f"t{i}") for i in range(30)]) == [True] * 30
        for i in range(30):
            keys = leases.keys(f"job{i}")
            assert client.keyslot(keys.marker) == client.keyslot(keys.lease)  # ...one slot each
            point = now - 10
            first = leases.admit(
                f"job{i}",
                point_ms=point,
                period_end_ms=point + 60_000,
                token="a",
                lease_ttl_ms=5000,
            )
            again = leases.admit(
                f"job{i}",
                point_ms=point,
                period_end_ms=point + 60_000,
                token="b",
                lease_ttl_ms=5000,
            )
            later = leases.admit(
                f"job{i}",
                point_ms=point + 1,
                period_end_ms=point + 60_000,
                token="c",
                lease_ttl_ms=5000,
            )
            assert (first.outcome, again.outcome, later.outcome) == (
                AdmissionOutcome.ADMITTED,
                AdmissionOutcome.DUPLICATE,
                AdmissionOutcome.OVERLAP,
            )
            assert leases.release(f"job{i}", token="a") is True
        runtime.close()
        client.close()
    finally:
        cluster.stop()


def test_jobs_definition_error_is_a_configuration_error() -> None:
    from platform_tasks.errors import ConfigurationError

    assert issubclass(JobDefinitionError, ConfigurationError)
    assert issubclass(JobStartupError, ConfigurationError)
    assert timedelta  # keeps the job template's import used
    assert ManagedRedis
