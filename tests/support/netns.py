"""Several hosts on one machine: network namespaces joined by a bridge, and partitions.

Each host is a network namespace with one veth into a "switch" namespace that holds a
bridge. The test process (the root namespace) joins the switch through a veth of its own,
like an operator's machine on the same network, and is never partitioned. Addresses come
from a private ``10.231.X.0/24`` that no interface or route of the root namespace uses
when the network is made.

A partition disables a host's bridge port (STP port state ``disabled``): the switch drops
its frames both ways while the host's link and carrier stay up. TCP connections across
the cut neither reset nor fail fast; they stall and retransmit until the port forwards
again, as when a switch port or a path between racks fails silently. (``tc`` filters and
``netem`` would do the same but are not available on every kernel; the bridge is.)

Every name starts with ``ptnet<pid>``, so a run never meets another run's namespaces.
Namespaces and links of the same family whose pid is no longer alive (a run killed before
its finalizer) are removed when a network is made; :meth:`HostNetwork.close` ends every
process still inside this network's namespaces and removes them all.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

FAMILY = "ptnet"
"""Prefix of every namespace and root-namespace link this module creates."""

_FAMILY_NAME = re.compile(rf"^{FAMILY}(?P<pid>\d+)(?:-\S+)?$")
_SWITCH = "switch"
_BRIDGE = "br0"
_PORT_FORWARDING = "3"
_PORT_DISABLED = "0"


class NetworkSetupError(RuntimeError):
    """A namespace, link or address of the test network could not be made or removed."""


def ip(*args: str, timeout: float = 30.0) -> str:
    """Run ``ip ARGS`` and return its output; raise :class:`NetworkSetupError` naming the
    command and its error when it fails."""
    return _run(["ip", *args], timeout=timeout)


def _run(argv: Sequence[str], *, timeout: float = 30.0) -> str:
    try:
        result = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkSetupError(f"{' '.join(argv)} could not run: {exc}") from exc
    if result.returncode != 0:
        raise NetworkSetupError(
            f"{' '.join(argv)} failed (exit {result.returncode}): "
            f"{result.stderr.decode(errors='replace').strip()} "
            "(the across-hosts test needs root and 'ip netns')"
        )
    return result.stdout.decode(errors="replace")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _end_processes_in(namespace: str) -> None:
    """SIGKILL every process left inside ``namespace`` (a deleted namespace would keep
    existing while they run)."""
    with suppress(NetworkSetupError):
        for pid in ip("netns", "pids", namespace).split():
            with suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def remove_leftovers() -> list[str]:
    """Remove namespaces and root links of this family whose run's pid is gone."""
    removed = []
    for namespace in _namespaces():
        match = _FAMILY_NAME.match(namespace)
        if match and not _alive(int(match["pid"])):
            _end_processes_in(namespace)
            with suppress(NetworkSetupError):
                ip("netns", "delete", namespace)
                removed.append(namespace)
    for line in ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        match = _FAMILY_NAME.match(name)
        if match and not _alive(int(match["pid"])):
            with suppress(NetworkSetupError):
                ip("link", "delete", name)
                removed.append(name)
    return removed


def free_subnet(first: int = 100, last: int = 199) -> ipaddress.IPv4Network:
    """A ``10.231.X.0/24`` that no address or route of the root namespace overlaps."""
    used: list[ipaddress.IPv4Network] = []
    for line in ip("-4", "-o", "addr", "show").splitlines():
        parts = line.split()
        if "inet" in parts:
            used.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        target = line.split()[0] if line.split() else ""
        with suppress(ValueError):
            if target not in {"default", "local", "broadcast", "unreachable"}:
                used.append(ipaddress.ip_network(target, strict=False))
    span = last - first + 1
    start = os.getpid() % span
    for offset in range(span):
        candidate = ipaddress.ip_network(f"10.231.{first + (start + offset) % span}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise NetworkSetupError(f"no free 10.231.{first}-{last}.0/24 subnet in the root namespace")


@dataclass(frozen=True)
class Host:
    """One simulated host: its namespace, its address and its port on the switch."""

    name: str
    namespace: str
    address: str
    port: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (inside its network namespace)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class HostNetwork:
    """A switch namespace, one namespace per named host and a root-namespace link.

    Use as a context manager (or call :meth:`create` and :meth:`close`): ``close`` runs
    even when creating failed half-way, and removes whatever exists.
    """

    def __init__(self, host_names: Sequence[str]) -> None:
        if len(set(host_names)) != len(host_names):
            raise ValueError(f"host names must be unique: {list(host_names)}")
        self.tag = f"{FAMILY}{os.getpid()}"
        self.host_names = list(host_names)
        self.switch = f"{self.tag}-{_SWITCH}"
        self.control_link = self.tag  # the root namespace's end, at most 15 characters
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self.control_address = ""
        self.removed_leftovers: list[str] = []

    def __enter__(self) -> HostNetwork:
        try:
            return self.create()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def create(self) -> HostNetwork:
        self.removed_leftovers = remove_leftovers()
        subnet = free_subnet()
        self.subnet = subnet
        addresses = list(subnet.hosts())
        prefix = subnet.prefixlen
        self.control_address = str(addresses[0])
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", _BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", _BRIDGE, "up")
        # the root namespace's own port: the test process reaches every host through it
        ip(
            "link",
            "add",
            self.control_link,
            "type",
            "veth",
            "peer",
            "name",
            "control",
            "netns",
            self.switch,
        )
        self._attach("control")
        ip("addr", "add", f"{self.control_address}/{prefix}", "dev", self.control_link)
        ip("link", "set", self.control_link, "up")
        for index, name in enumerate(self.host_names):
            namespace = f"{self.tag}-{name}"
            port = f"p{index}"
            address = str(addresses[9 + index])
            ip("netns", "add", namespace)
            ip(
                "-n",
                self.switch,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                namespace,
            )
            self._attach(port)
            ip("-n", namespace, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")
            ip("-n", namespace, "link", "set", "lo", "up")
            self.hosts[name] = Host(name, namespace, address, port)
        return self

    def _attach(self, port: str) -> None:
        ip("-n", self.switch, "link", "set", port, "master", _BRIDGE)
        ip("-n", self.switch, "link", "set", port, "up")

    def _port_state(self, host: Host, state: str) -> None:
        _run(["bridge", "-n", self.switch, "link", "set", "dev", host.port, "state", state])

    def partition(self, *names: str) -> None:
        """Cut the named hosts off the switch: their frames are dropped both ways."""
        for name in names:
            self._port_state(self.hosts[name], _PORT_DISABLED)

    def heal(self, *names: str) -> None:
        """Let the named hosts' ports forward again."""
        for name in names:
            self._port_state(self.hosts[name], _PORT_FORWARDING)

    def port_states(self) -> dict[str, str]:
        """Each host's bridge port state as ``bridge link`` prints it (``forwarding``...)."""
        out = _run(["bridge", "-n", self.switch, "link", "show"])
        states = {}
        for host in self.hosts.values():
            match = re.search(rf"\b{host.port}@\S+.*? state (\S+)", out)
            states[host.name] = match.group(1) if match else "missing"
        return states

    def namespaces(self) -> list[str]:
        """This network's namespaces that exist now."""
        return [n for n in _namespaces() if n == self.switch or n.startswith(f"{self.tag}-")]

    def close(self) -> None:
        """End the processes left in this network's namespaces and remove everything."""
        errors = []
        for namespace in self.namespaces():
            _end_processes_in(namespace)
            try:
                ip("netns", "delete", namespace)
            except NetworkSetupError as exc:
                errors.append(str(exc))
        with suppress(NetworkSetupError):  # gone with the switch namespace already
            ip("link", "delete", self.control_link)
        if errors:
            raise NetworkSetupError("; ".join(errors))
