"""Throughput and CPU per task against the baselines users would pick, in one run.

Rows: a plain Celery app with Celery's defaults (stock kombu transport, events off), the
same app with events on (``-E``), Dramatiq (2 processes x 8 threads) on the same Redis,
the platform no-op with events off and on, and PlatformTask (validation + idempotency
commit) with events on. Every Celery row is ``celery worker -P prefork -c 2`` with late
acks; ``--prefetch`` sets the multiplier (the issue's table uses 4; the platform default
is 1, so the platform rows also run at 1 unless ``--no-default-prefetch``).

Each row drains a queue pre-filled with ``--messages`` tasks; the clock and the CPU time
(utime + stime from ``/proc/<pid>/stat``) of the worker's main process and of all its
processes are read when the queue starts shrinking and when it is empty with nothing
left unacked. Rows run interleaved for ``--rounds`` rounds; medians are reported, and the
ratios are medians of the per-round ratios.

    .venv/bin/pip install -r bench/requirements.txt   # Dramatiq, the bench's own dependency
    .venv/bin/python bench/celery_baselines.py --messages 10000 --rounds 3

``--profile ROW`` records the main process of that row with py-spy (also in
``bench/requirements.txt``) and prints the functions with the most samples.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from platform_tasks import QueuePort  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from tests.support.processes import CELERY, VENV_BIN, CeleryProcess, platform_env  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # "plain", "platform", "dramatiq"
    task: str = "bench.noop"
    events: bool = False
    prefetch: int = 4
    celery_dispatcher: bool = False

    @property
    def queue(self) -> str:
        return {"plain": "celery", "platform": "default", "dramatiq": "dramatiq:default"}[self.kind]


def rows(prefetch: int, default_prefetch: bool) -> list[Row]:
    found = [
        Row("plain Celery, events off", "plain", prefetch=prefetch),
        Row("plain Celery, events on (-E)", "plain", events=True, prefetch=prefetch),
        Row("Dramatiq 2x8", "dramatiq", prefetch=0),
        Row("platform no-op, events off", "platform", prefetch=prefetch),
        Row(
            "platform no-op, events on, Celery's dispatcher",
            "platform",
            events=True,
            prefetch=prefetch,
            celery_dispatcher=True,
        ),
        Row("platform no-op, events on", "platform", events=True, prefetch=prefetch),
        Row("PlatformTask, events on", "platform", "bench.platform_noop", True, prefetch),
    ]
    if default_prefetch and prefetch != 1:
        found += [
            Row("platform no-op, events on, prefetch 1", "platform", events=True, prefetch=1),
            Row("PlatformTask, events on, prefetch 1", "platform", "bench.platform_noop", True, 1),
        ]
    return found


@dataclass
class Result:
    row: Row
    tasks: int
    seconds: float
    main_cpu: float
    all_cpu: float
    redis_calls: dict[str, int] = field(default_factory=dict)
    pg_statements: int = 0
    pg_commits: int = 0
    counted: int = 0
    load: float = field(default_factory=lambda: os.getloadavg()[0])

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds

    def redis_per_task(self) -> str:
        per = self.counted or self.tasks
        calls = sorted(self.redis_calls.items(), key=lambda item: -item[1])
        return " ".join(f"{name} {count / per:.2f}" for name, count in calls if count / per >= 0.01)

    @property
    def main_us(self) -> float:
        return self.main_cpu * 1e6 / self.tasks

    @property
    def all_us(self) -> float:
        return self.all_cpu * 1e6 / self.tasks


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            kids = [
                int(p) for p in Path(f"/proc/{current}/task/{current}/children").read_text().split()
            ]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def publish(row: Row, redis_url: str, database_url: str, count: int) -> None:
    env = {
        "PLATFORM_REDIS_URL": redis_url,
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_PROFILE": "bench",
    }
    os.environ.update(env)
    if row.kind == "dramatiq":
        from bench.dramatiq_app import noop as dramatiq_noop

        for _ in range(count):
            dramatiq_noop.send()
        return
    if row.kind == "plain":
        from bench.plain_celery_app import app as plain_app

        with plain_app.producer_or_acquire() as producer:
            for _ in range(count):
                plain_app.send_task(row.task, producer=producer)
        return
    from bench.events_bench_app import app

    if row.task == "bench.platform_noop":
        port = QueuePort(app)
        for n in range(count):
            port.publish("default", {"tenant_id": "bench", "kind": row.task, "data": {"n": n}})
        return
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            app.send_task(row.task, queue="default", producer=producer)


def argv_for(row: Row) -> list[str]:
    if row.kind == "dramatiq":
        return [
            str(VENV_BIN / "dramatiq"),
            "bench.dramatiq_app",
            "--processes",
            "2",
            "--threads",
            "8",
        ]
    app = "bench.plain_celery_app" if row.kind == "plain" else "bench.events_bench_app"
    argv = [
        CELERY,
        "-A",
        app,
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "--loglevel",
        "WARNING",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
        "--prefetch-multiplier",
        str(row.prefetch),
    ]
    if row.kind == "plain" and row.events:
        argv.append("-E")
    return argv


def backlog(client: redis.Redis, row: Row) -> Callable[[], int]:
    if row.kind == "dramatiq":
        return lambda: int(client.llen(row.queue))
    return lambda: int(client.llen(row.queue))


def drained(client: redis.Redis, row: Row) -> Callable[[], bool]:
    if row.kind == "dramatiq":
        return lambda: client.hlen(f"{row.queue}.msgs") == 0
    return lambda: client.llen(row.queue) == 0 and client.hlen("unacked") == 0


class StatsPostgres(PostgresServer):
    """The harness's PostgreSQL with ``pg_stat_statements`` loaded, to count statements."""

    def argv(self) -> list[str]:
        return [*super().argv(), "-c", "shared_preload_libraries=pg_stat_statements"]


def redis_commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def pg_counts(database_url: str) -> tuple[int, int]:
    """(statements executed, transactions committed) in the bench database so far."""
    import psycopg2

    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
                "AND s.query NOT LIKE '%pg_stat%'"
            )
            statements = int(cur.fetchone()[0])
            cur.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            commits = int(cur.fetchone()[0])
    finally:
        conn.close()
    return statements, commits


def measure(
    row: Row,
    redis_url: str,
    database_url: str,
    count: int,
    logs: Path,
    profile: Path | None = None,
    profile_pool: bool = False,
) -> Result:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    publish(row, redis_url, database_url, count)
    left_of = backlog(client, row)
    assert left_of() == count, f"{row.name}: messages were not all published"
    extra = {
        "BENCH_TASK_EVENTS": "1" if row.events else "0",
        "BENCH_CELERY_DISPATCHER": "1" if row.celery_dispatcher else "0",
    }
    env = platform_env(
        redis_url=redis_url, database_url=database_url, pythonpath=[REPO], extra=extra
    )
    client.config_resetstat()
    pg_before = pg_counts(database_url)
    log = logs / f"{row.name.replace(' ', '-')}-{time.monotonic_ns()}.log"
    worker = CeleryProcess(argv_for(row), env=env, cwd=REPO, log_path=log).start()
    spy: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            lambda: left_of() < count,
            timeout=120,
            interval=0.002,
            message=f"{row.name}: worker to start consuming",
        )
        procs = [worker.pid, *descendants(worker.pid)]
        start, left = time.monotonic(), left_of()
        main0, all0 = cpu_seconds(worker.pid), sum(cpu_seconds(p) for p in procs)
        if profile is not None:
            target = procs[1] if profile_pool and len(procs) > 1 else worker.pid
            # a pool process: only samples holding the GIL (its Python CPU, not its waits on
            # PostgreSQL, Redis or the pipe to the main process)
            how = "--gil" if profile_pool else "-n"
            spy_argv = [
                str(VENV_BIN / "py-spy"),
                "record",
                "-p",
                str(target),
                "-r",
                "250",
                "-f",
                "raw",
                "-o",
                str(profile),
                how,
            ]
            spy = subprocess.Popen(spy_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(
            drained(client, row),
            timeout=600,
            interval=0.002,
            message=f"{row.name}: queue drained and acked",
        )
        end = time.monotonic()
        main1, all1 = cpu_seconds(worker.pid), sum(cpu_seconds(p) for p in procs)
        calls = redis_commands(client)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
        worker.stop(timeout=20)
    pg_after = pg_counts(database_url)  # after the worker's backends exited and reported
    # Counted over the whole run (all ``count`` tasks, worker start-up included).
    got = Result(
        row,
        count,
        end - start,
        main1 - main0,
        all1 - all0,
        calls,
        pg_after[0] - pg_before[0],
        pg_after[1] - pg_before[1],
    )
    got.tasks = left  # timed over the tasks left when the clock started
    got.counted = count
    return got


def top_functions(
    raw: Path, limit: int = 30, thread: str = "asynloop"
) -> list[tuple[str, float, float]]:
    """(function, self %, inclusive %) of one thread from a py-spy raw file.

    ``thread`` is a frame the thread's stacks contain: ``asynloop`` for the main process's
    event loop, ``trace_task`` for a pool process running tasks.
    """
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        n = int(samples)
        frames = stack.split(";")
        if not any(frame.startswith(thread) for frame in frames):
            continue  # other threads (the delay promoter waiting), or a pool process idle
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return [
        (name, 100 * own[name] / total, 100 * inclusive[name] / total)
        for name, _ in inclusive.most_common(limit)
    ]


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(all_rounds: list[dict[str, Result]], table: list[Row]) -> None:
    print(
        "\n| row | tasks/s median (min-max) | main-process CPU us/task | all processes CPU "
        "us/task | load avg |"
    )
    print("|---|---|---|---|---|")
    for row in table:
        got = [r[row.name] for r in all_rounds]
        rates = [g.rate for g in got]
        print(
            f"| {row.name} | {_median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f}) | "
            f"{_median([g.main_us for g in got]):.0f} | {_median([g.all_us for g in got]):.0f}"
            f" | {_median([g.load for g in got]):.1f} |"
        )

    def ratio(top: str, bottom: str) -> str:
        per_round = [r[top].rate / r[bottom].rate for r in all_rounds if top in r and bottom in r]
        if not per_round:
            return "n/a"
        return f"{_median(per_round):.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    base, names = "plain Celery, events off", {row.name for row in table}
    print("\n| ratio (tasks/s, median of per-round ratios) | value | target |")
    print("|---|---|---|")
    default = "(platform default prefetch)"
    pairs = [
        ("platform no-op, events on", base, ">= 1.3x"),
        ("PlatformTask, events on", base, ">= 1.0x"),
        ("PlatformTask, events on", "Dramatiq 2x8", "report"),
        ("plain Celery, events on (-E)", base, "(what -E costs plain Celery)"),
        ("platform no-op, events on, prefetch 1", base, default),
        ("PlatformTask, events on, prefetch 1", base, default),
    ]
    for top, bottom, target in pairs:
        if top in names and bottom in names:
            print(f"| {top} / {bottom} | {ratio(top, bottom)} | {target} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument(
        "--no-default-prefetch", action="store_true", help="skip the platform rows at prefetch 1"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only rows whose name contains this (repeatable)",
    )
    parser.add_argument("--profile", help="py-spy record the main process of this row")
    parser.add_argument("--profile-lines", type=int, default=45)
    parser.add_argument(
        "--profile-pool",
        action="store_true",
        help="with --profile: record a pool process (its task-running "
        "samples) instead of the main process",
    )
    args = parser.parse_args()
    table = rows(args.prefetch, not args.no_default_prefetch)
    if args.only:
        table = [row for row in table if any(part in row.name for part in args.only)]
    base = Path(tempfile.mkdtemp(prefix="bench-baselines-"))
    os.chmod(base, 0o755)
    redis_server = RedisServer(base / "redis", appendonly=False).start()
    postgres = StatsPostgres(base / "pg" / "data").start()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    try:
        migrate(postgres.url)
        import psycopg2

        with psycopg2.connect(postgres.url) as conn, conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if args.profile:
            row = next(r for r in table if r.name == args.profile)
            raw = base / "profile.txt"
            result = measure(
                row,
                redis_server.url,
                postgres.url,
                args.messages,
                base,
                raw,
                profile_pool=args.profile_pool,
            )
            print(
                f"{row.name}: {result.rate:.0f} tasks/s, {result.main_us:.0f} us main CPU/task"
                f", {result.all_us:.0f} us all CPU/task"
            )
            thread = "fast_trace_task" if args.profile_pool else "asynloop"
            for name, own, incl in top_functions(raw, args.profile_lines, thread):
                print(f"{incl:5.1f}% incl {own:5.1f}% self  {name}")
            return
        all_rounds: list[dict[str, Result]] = []
        for round_no in range(args.rounds):
            results: dict[str, Result] = {}
            for row in table:
                got = measure(row, redis_server.url, postgres.url, args.messages, base)
                results[row.name] = got
                print(
                    f"round {round_no + 1} {row.name:40s} {got.rate:7.0f} tasks/s "
                    f"{got.main_us:6.0f} us main CPU/task {got.all_us:6.0f} us all CPU/task "
                    f"load {got.load:.1f}",
                    flush=True,
                )
            all_rounds.append(results)
        report(all_rounds, table)
        print(
            "\n| row | Redis commands per task (last round, start-up included) | "
            "PostgreSQL statements / commits per task |"
        )
        print("|---|---|---|")
        for row in table:
            last = all_rounds[-1][row.name]
            per = last.counted or last.tasks
            print(
                f"| {row.name} | {last.redis_per_task()} | "
                f"{last.pg_statements / per:.2f} / {last.pg_commits / per:.2f} |"
            )
        print(f"\nload average at end: {os.getloadavg()}")
    finally:
        postgres.close()
        redis_server.stop()


if __name__ == "__main__":
    main()
