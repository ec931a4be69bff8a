"""The Redis Cluster the suite starts survives a port another process took first."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.servers import RedisClusterServers


def test_a_bus_port_taken_before_the_node_binds_it_gets_a_fresh_pair(tmp_path: Path) -> None:
    """A node's ports are free when picked, but another process can bind the cluster
    bus port (port + 10000) before the node starts (seen on a busy machine: "Failed
    listening on port … (cluster), aborting"). The node then starts on a fresh pair and
    the cluster forms, instead of failing the test that needed it."""
    cluster = RedisClusterServers(tmp_path / "cluster")
    first = cluster.servers[0]
    picked = first.port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", picked + 10000))
        holder.listen()
        try:
            cluster.start()
            assert first.port != picked
            assert cluster.cluster_ok()
        finally:
            cluster.stop()
