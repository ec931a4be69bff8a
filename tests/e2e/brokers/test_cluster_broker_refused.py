"""``PLATFORM_BROKER_URL`` pointing at a node of a real three-node Redis Cluster: the
README's ``celery -A app worker`` refuses to start (non-zero exit within 10 s) with an
error naming the setting, saying the server is a cluster node and what to use instead,
instead of looping on the delay promoter's MOVED/CROSSSLOT errors.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, platform_env
from tests.support.servers import RedisClusterServers

APP = "tests.apps.basic_app"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


def test_worker_with_a_cluster_node_as_broker_refuses_to_start(
    cluster: RedisClusterServers, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = platform_env(
        redis_url=redis_url, database_url=database_url, extra={"PLATFORM_BROKER_URL": cluster.url}
    )
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [CELERY, "-A", APP, "worker", "--loglevel", "INFO"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        started = time.monotonic()
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.wait(timeout=30)
            tail = log_path.read_text()[-3000:]
            raise AssertionError(f"worker still running after 10 s:\n{tail}") from exc
    output = log_path.read_text(errors="replace")
    assert code != 0, output[-3000:]
    assert time.monotonic() - started < 10
    assert "PLATFORM_BROKER_URL" in output, output[-3000:]
    assert "Redis Cluster" in output and "cluster_enabled:1" in output, output[-3000:]
    assert "RabbitMQ" in output and "PLATFORM_REDIS_CLUSTER=true" in output, output[-3000:]
    assert "MovedError" not in output and "delay promotion failed" not in output, output[-3000:]
