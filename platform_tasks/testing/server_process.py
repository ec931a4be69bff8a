"""Child processes of the test servers: free ports, waiting on a condition, and the
server process that dies with its parent.

What :mod:`platform_tasks.testing.servers` builds its Redis and PostgreSQL on, kept apart
so the servers module holds the servers themselves. ``free_port``, ``wait_until`` and
``in_network_namespace`` are imported from ``platform_tasks.testing.servers`` by users'
tests too, and stay importable there.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from platform_tasks.errors import ServerStartError

_PR_SET_PDEATHSIG = 1
_UNPRIVILEGED_USER = "nobody"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, max_port: int = 65535, attempts: int = 1000) -> int:
    """A loopback TCP port nobody listens on right now, at most ``max_port``.

    The kernel picks the port; picks above ``max_port`` are drawn again (up to
    ``attempts`` times, then :class:`ServerStartError`).
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port <= max_port:
            return port
    raise ServerStartError(f"no free loopback port at most {max_port} after {attempts} tries")


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.05,
    message: str = "condition",
) -> None:
    """Poll ``condition`` until it is true; raise ``TimeoutError`` at the deadline.

    This is the one way the harness and the tests synchronise with other processes:
    a condition with a deadline, never a bare sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except ServerStartError:
            raise
        except Exception:  # a server that is still starting answers with errors
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {message}")
        time.sleep(interval)


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM the child when the process that started it dies."""
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def in_network_namespace(
    argv: Sequence[str], netns: str | None, ids: tuple[int, int] | None = None
) -> list[str]:
    """``argv`` run inside network namespace ``netns`` (none: unchanged), as ``ids``.

    Entering a namespace needs root, so a server that must not run as root (PostgreSQL)
    drops to ``ids`` after entering it, through ``setpriv``; its parent-death signal is
    set again after the switch (a credential change clears it).
    """
    if netns is None:
        return list(argv)
    prefix = ["ip", "netns", "exec", netns]
    if ids is not None:
        prefix += [
            "setpriv",
            f"--reuid={ids[0]}",
            f"--regid={ids[1]}",
            "--clear-groups",
            "--pdeathsig",
            "TERM",
        ]
    return [*prefix, *argv]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class _Process:
    """A server child process and where its log goes."""

    argv: Sequence[str]
    log_path: Path
    user: int | None = None
    group: int | None = None
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                user=self.user,
                group=self.group,
                env=self.env,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.running and self.popen is not None:
            self.popen.send_signal(signum)

    def wait(self, timeout: float) -> None:
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
