"""The host network of the across-hosts test: a partition drops traffic and a heal
restores it, a crashed run's namespaces are removed by the next run, and ``close``
leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.netns import FAMILY, HostNetwork, ip, remove_leftovers

CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
    "    sys.exit(1)\n"
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _connects(network: HostNetwork, host: str, address: str, port: int) -> tuple[bool, str]:
    result = subprocess.run(
        network[host].command([sys.executable, "-c", CONNECT, address, str(port)]),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0, result.stdout.strip()


def test_partition_drops_both_ways_and_heal_restores() -> None:
    with HostNetwork(["a", "b"]) as network:
        listener = subprocess.Popen(
            network["b"].command(
                [
                    sys.executable,
                    "-c",
                    "import socket, time\n"
                    "s = socket.create_server(('0.0.0.0', 4711))\n"
                    "print('listening', flush=True)\n"
                    "while True: s.accept()[0].close()\n",
                ]
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
            b = network["b"].address
            assert _connects(network, "a", b, 4711) == (True, "")
            network.partition("b")
            assert network.port_states()["b"] == "disabled"
            # silently dropped: a timeout, not a refusal or an unreachable network
            assert _connects(network, "a", b, 4711) == (False, "TimeoutError")
            network.heal("b")
            assert _connects(network, "a", b, 4711) == (True, "")
        finally:
            listener.kill()
            listener.wait(timeout=10)
    assert not network.namespaces()
    assert f"{network.control_link}:" not in ip("-o", "link", "show")


def test_leftovers_of_a_dead_run_are_removed_and_a_live_runs_kept() -> None:
    dead = f"{FAMILY}{_dead_pid()}-servers"
    ip("netns", "add", dead)
    try:
        with HostNetwork(["a"]) as network:
            assert dead in network.removed_leftovers
            assert network.switch in network.namespaces()
            assert network.switch not in remove_leftovers()  # our own pid is alive
    finally:
        if dead in ip("netns", "list"):
            ip("netns", "delete", dead)
    assert not network.namespaces()


def test_host_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        HostNetwork(["a", "a"])
