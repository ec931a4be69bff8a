"""Servers only the test suite starts: a Redis Cluster and a RabbitMQ node, from binaries.

The Redis and PostgreSQL servers a project's own tests (and ``platform-tasks dev``) need
ship with the package in :mod:`platform_tasks.testing.servers`; these reuse its process
handling (parent-death signal, network namespaces, waiting with a deadline).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from platform_tasks.errors import ServerStartError
from platform_tasks.testing.server_process import _port_is_free, _Process
from platform_tasks.testing.servers import RedisServer, find_redis_server, free_port, wait_until

CLUSTER_BUS_OFFSET = 10000
"""A Redis Cluster node also listens on its port plus this offset (the cluster bus)."""


MAX_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET

PORT_TAKEN_SIGNS = ("eaddrinuse", "dist_port_already_used")
"""How a node's start-up log says a port it was given is bound by someone else."""


def free_cluster_port(attempts: int = 1000) -> int:
    """A free port for a Redis Cluster node whose bus port (port + 10000) is free too."""
    for _ in range(attempts):
        port = free_port(max_port=MAX_CLUSTER_PORT)
        if _port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise ServerStartError(f"no free cluster node port after {attempts} tries")


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


def start_on_a_free_port(server: RedisServer, attempts: int) -> None:
    """Start a cluster node, on a fresh port pair when its port or bus port was taken.

    The ports are free when :func:`free_cluster_port` picks them, but another process on
    the machine may bind either before the node does (the kernel hands out ephemeral
    ports from the same range): the node then exits with "Address already in use".
    """
    for attempt in range(attempts):
        try:
            server.start()
            return
        except ServerStartError as exc:
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise
            server.port = free_cluster_port()


class RedisClusterServers:
    """Several cluster-mode ``redis-server`` nodes joined into one Redis Cluster."""

    def __init__(self, data_dir: Path, nodes: int = 3) -> None:
        self.data_dir = Path(data_dir)
        self.servers = [
            RedisServer(
                self.data_dir / f"node{i}",
                free_cluster_port(),
                appendonly=False,
                extra_args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            )
            for i in range(nodes)
        ]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", server.port) for server in self.servers]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self, timeout: float = 60.0, port_attempts: int = 5) -> RedisClusterServers:
        for server in self.servers:
            start_on_a_free_port(server, port_attempts)
        addresses = [f"127.0.0.1:{server.port}" for server in self.servers]
        subprocess.run(
            [
                str(find_redis_cli()),
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
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
            connection = amqp.Connection(
                f"127.0.0.1:{self.port}",
                userid=self.user,
                password=self.password,
                connect_timeout=2,
            )
            try:
                connection.connect()
            finally:
                connection.collect()
            return True

        try:
            wait_until(
                ready,
                timeout=timeout,
                interval=0.25,
                message=f"rabbitmq-server on port {self.port}",
            )
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
        out = self.ctl(
            "list_queues", "-p", vhost, "--quiet", "--no-table-headers", "name", "messages"
        )
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
