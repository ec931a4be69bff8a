"""PlatformTask on RabbitMQ against a plain Celery task doing the same INSERT on RabbitMQ,
and against the PlatformTask on Redis, in the same run.

Usage: .venv/bin/python bench/rabbitmq_throughput.py [--jobs 2000] [--runs 3] [--sql-floor]

``--sql-floor`` adds a fourth variant on RabbitMQ: a plain Celery task that sends exactly
the SQL of a PlatformTask's applied job (``BEGIN`` + ``core.claim_delivery``, the insert,
``COMMIT``) and runs none of the platform's Python, which splits the gap to plain Celery
into what the idempotency row costs and what the pipeline's own code costs.

One RabbitMQ node, one Redis and one PostgreSQL from the harness; one ``-P prefork -c 2``
worker per variant (``bench/consumer_app.py``). The queue is filled first, then the worker
starts; the clock runs from the moment a tenth of the jobs were taken to the last row
written. Each ratio is taken within one run; the median over runs is printed.

Each variant starts from the same state: the one before it has its queue deleted, its
rows truncated and PostgreSQL checkpointed, and the next one starts its worker only when
the machine's CPUs are idle again (under 10 % busy over half a second), after the fill
too. Without that, the work a variant leaves behind (RabbitMQ's quorum-queue log, the
database's writes) ran during the next one: whichever RabbitMQ variant ran right after
the other was the slower (594 then 463 jobs/s in one order, 530 then 474 in the other:
single-run ratios 0.78 and 1.12).

Each variant also prints the share of the machine's CPU time the host took for other
guests while it ran (``steal`` in ``/proc/stat``): on a shared virtual machine that share
moves single-run ratios more than the code does, so read a median over several runs.

And the machine's busy CPU per job while it drained (user, system and interrupt time of
every process in ``/proc/stat``: the worker, PostgreSQL, RabbitMQ, this script's polling).
With ``-c 2`` and a prefetch of one the drain keeps the machine about two thirds busy
(each job waits for its predecessor's ack to reach RabbitMQ), and over a run's variants
that share stays put (1.32 to 1.44 of the 2 cores in 48 variants on 2026-12-04) while the
CPU a job costs moves with the rate: a slow variant is one where the same work took more
CPU time, most likely because the host ran this machine's CPUs slower for a while, which
the steal share does not show. The ratio of jobs per busy CPU second is printed beside
the throughput ratio for that reason, not as a steadier substitute.

That busy CPU is also split by where it ran (``/proc/<pid>/stat`` of every process, named
by its session's leader: the worker and each server run in a session of their own, and so
does each PostgreSQL and Erlang child process): the worker's main process, its pool
processes, PostgreSQL, RabbitMQ, Redis, and the rest (kernel threads, this script, and
processes that exited meanwhile, such as the backends of its row counts). The medians of
the platform's minus plain Celery's per part show which processes the gap is in.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from tests.support.servers import RabbitMQServer  # noqa: E402


def create_bench_schema(db_url: str) -> None:
    """The platform's tables and the one the bench tasks insert into."""
    migrate(db_url)
    conn = psycopg2.connect(db_url)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS public.bench_work (job_id uuid PRIMARY KEY)")
    conn.close()


@contextlib.contextmanager
def bench_servers(
    prefix: str,
) -> Iterator[tuple[Path, RedisServer, PostgresServer, RabbitMQServer]]:
    """(folder, Redis, PostgreSQL with the schema, one RabbitMQ node), stopped at exit."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    with contextlib.ExitStack() as stack:
        rs = RedisServer(base / "redis").start()
        stack.callback(rs.stop)
        pg = PostgresServer(base / "pg" / "data").start()
        stack.callback(pg.stop)
        mq = RabbitMQServer(base / "rabbitmq").start()
        stack.callback(mq.close)
        create_bench_schema(pg.url)
        yield base, rs, pg, mq


def rows(db_url: str) -> int:
    conn = psycopg2.connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM public.bench_work")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def ready_count(broker_url: str, queue: str) -> int:
    if broker_url.startswith("redis"):
        with redis.Redis.from_url(broker_url) as client:
            return int(client.llen(queue))
    with kombu.Connection(broker_url) as conn:
        _, count, _ = conn.default_channel.queue_declare(queue, passive=True)
        return int(count)


def cpu_busy(seconds: float = 0.5) -> float:
    """The fraction of the machine's CPU time that was busy over ``seconds`` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    busy0, total0 = sample()
    time.sleep(seconds)  # the sampling interval of a measurement, not a synchronisation
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)


def cpu_ticks() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of the whole machine so far (/proc/stat's first line).

    Busy is user + nice + system + irq + softirq: the CPU the worker, PostgreSQL, RabbitMQ
    and everything else on the machine used, without idle, I/O wait and steal.
    """
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal, sum(fields[:8])


PARTS = ("worker main", "worker pool", "PostgreSQL", "RabbitMQ", "Redis", "rest")
"""Where a variant's busy CPU ran (see the module docstring)."""

_SERVER_PARTS = (
    ("postgres", "PostgreSQL"),
    ("beam", "RabbitMQ"),
    ("erl", "RabbitMQ"),
    ("epmd", "RabbitMQ"),
    ("inet_gethost", "RabbitMQ"),
    ("redis", "Redis"),
)


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(command name, session id, user + system jiffies) of one process, if it still exists."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    name = text[text.find("(") + 1 : text.rfind(")")]
    fields = text[text.rfind(")") + 2 :].split()
    return name, int(fields[3]), int(fields[11]) + int(fields[12])


def cpu_by_part(worker_pid: int) -> dict[str, int]:
    """Jiffies each part of the machine has used so far; "rest" is the machine's busy
    total (``cpu_ticks``) minus the named parts."""
    procs = {
        pid: info
        for pid in os.listdir("/proc")
        if pid.isdigit()
        if (info := _stat(pid)) is not None
    }
    leader_names = {
        session: procs[str(session)][0] for _, session, _ in procs.values() if str(session) in procs
    }
    used = dict.fromkeys(PARTS, 0)
    for pid, (_, session, jiffies) in procs.items():
        if int(pid) == worker_pid:
            part = "worker main"
        elif session == worker_pid:
            part = "worker pool"
        else:
            leader = leader_names.get(session, "")
            part = next((p for prefix, p in _SERVER_PARTS if leader.startswith(prefix)), "")
        if part:
            used[part] += jiffies
    used["rest"] = cpu_ticks()[0] - sum(used.values())
    return used


def settle(broker_url: str, queue: str, db_url: str) -> None:
    """Leave nothing of a variant behind for the next: its queue, its rows, its writes."""
    if broker_url.startswith("redis"):
        with redis.Redis.from_url(broker_url) as client:
            client.delete(queue)
    else:
        with kombu.Connection(broker_url) as conn:
            conn.default_channel.queue_delete(queue)
    conn = psycopg2.connect(db_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("TRUNCATE public.bench_work, core.processed_jobs")
        cur.execute("CHECKPOINT")
    conn.close()
    wait_until(
        lambda: cpu_busy() < 0.10, timeout=120, interval=0.1, message="the machine to be idle again"
    )


def worker_env(broker_url: str, redis_url: str, db_url: str) -> dict[str, str]:
    """The environment of the fill and the worker: the platform's three servers."""
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        PLATFORM_REDIS_URL=redis_url,
        PLATFORM_DATABASE_URL=db_url,
        PLATFORM_BROKER_URL=broker_url,
    )


def fill(task: str, queue: str, jobs: int, env: dict[str, str]) -> None:
    """Publish ``jobs`` envelopes of ``task`` to ``queue`` (from a process of its own)."""
    code = (
        "import sys\n"
        "from bench.consumer_app import app\n"
        "from platform_tasks.envelope import uuid7\n"
        "task, queue, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "with app.producer_or_acquire() as producer:\n"
        "    for _ in range(jobs):\n"
        "        env = {'job_id': str(uuid7()), 'tenant_id': 'bench', 'correlation_id': 'bench',\n"
        "               'kind': task, 'data': {}}\n"
        "        app.send_task(task, args=[env], queue=queue, producer=producer)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, task, queue, str(jobs)], cwd=ROOT, env=env, check=True
    )


def worker_argv(queue: str, node: str | None = None) -> list[str]:
    """One ``-P prefork -c 2`` worker of ``bench/consumer_app.py`` consuming ``queue``
    (named ``node``, for two workers on one machine at once)."""
    return [
        str(Path(sys.executable).parent / "celery"),
        "-A",
        "bench.consumer_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "-Q",
        queue,
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "WARNING",
        *(["-n", node] if node else []),
    ]


def run_variant(
    task: str, broker_url: str, jobs: int, redis_url: str, db_url: str, log: Path, run: int
) -> tuple[float, float, float, dict[str, float]]:
    """(jobs/s, share of CPU stolen, busy CPU seconds per job, the same by part) of one
    variant's drain."""
    queue = f"bench_{task.split('.')[1]}_{broker_url[:4]}_{run}"
    env = worker_env(broker_url, redis_url, db_url)
    fill(task, queue, jobs, env)
    assert ready_count(broker_url, queue) == jobs
    wait_until(
        lambda: cpu_busy() < 0.10,
        timeout=120,
        interval=0.1,
        message="the machine to be idle after the fill",
    )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            worker_argv(queue),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        warm = jobs // 10
        wait_until(
            lambda: ready_count(broker_url, queue) <= jobs - warm, timeout=120, interval=0.01
        )
        start, ticks, parts = time.perf_counter(), cpu_ticks(), cpu_by_part(proc.pid)
        wait_until(lambda: rows(db_url) >= jobs, timeout=600, interval=0.05)
        elapsed, after = time.perf_counter() - start, cpu_ticks()
        parts_after = cpu_by_part(proc.pid)
        steal = (after[1] - ticks[1]) / max(1, after[2] - ticks[2])
        busy = (after[0] - ticks[0]) / os.sysconf("SC_CLK_TCK")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    settle(broker_url, queue, db_url)
    hz = os.sysconf("SC_CLK_TCK")
    per_part = {part: (parts_after[part] - parts[part]) / hz / (jobs - warm) for part in PARTS}
    return (jobs - warm) / elapsed, steal, busy / (jobs - warm), per_part


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sql-floor",
        action="store_true",
        help="also run the platform's SQL in a plain task on RabbitMQ",
    )
    args = parser.parse_args()
    with bench_servers("bench-rabbitmq-") as (base, rs, pg, mq):
        vs_plain: list[float] = []
        cpu_vs_plain: list[float] = []
        vs_redis: list[float] = []
        gap_by_part: dict[str, list[float]] = {part: [] for part in PARTS}
        floor_vs_plain: list[float] = []
        platform_vs_floor: list[float] = []
        variants = [("bench.plain", mq.url), ("bench.platform", mq.url), ("bench.platform", rs.url)]
        if args.sql_floor:
            variants.insert(1, ("bench.sql_floor", mq.url))
        for run in range(1, args.runs + 1):
            order = variants if run % 2 else variants[::-1]
            rate = {}
            cpu = {}
            split = {}
            for task, broker in order:
                log = base / "worker.log"
                rate[(task, broker)], steal, cpu[(task, broker)], split[(task, broker)] = (
                    run_variant(task, broker, args.jobs, rs.url, pg.url, log, run)
                )
                by_part = ", ".join(
                    f"{part} {split[(task, broker)][part] * 1e6:.0f}" for part in PARTS
                )
                print(
                    f"run {run} {task} on {broker.split(':')[0]}: "
                    f"{rate[(task, broker)]:.0f} jobs/s, "
                    f"{cpu[(task, broker)] * 1e6:.0f} us of busy CPU per job "
                    f"(CPU stolen by the host: {steal:.0%}); "
                    f"per job by part, us: {by_part}",
                    flush=True,
                )
            for part in PARTS:
                gap_by_part[part].append(
                    split[("bench.platform", mq.url)][part] - split[("bench.plain", mq.url)][part]
                )
            platform_mq = rate[("bench.platform", mq.url)]
            vs_plain.append(platform_mq / rate[("bench.plain", mq.url)])
            cpu_vs_plain.append(cpu[("bench.plain", mq.url)] / cpu[("bench.platform", mq.url)])
            vs_redis.append(platform_mq / rate[("bench.platform", rs.url)])
            print(
                f"run {run} platform/plain on RabbitMQ = {vs_plain[-1]:.2f} (target >= 0.85), "
                f"jobs per busy CPU second {cpu_vs_plain[-1]:.2f}; "
                f"platform RabbitMQ/Redis = {vs_redis[-1]:.2f}",
                flush=True,
            )
            if args.sql_floor:
                floor = rate[("bench.sql_floor", mq.url)]
                floor_vs_plain.append(floor / rate[("bench.plain", mq.url)])
                platform_vs_floor.append(platform_mq / floor)
                print(
                    f"run {run} SQL floor/plain = {floor_vs_plain[-1]:.2f}; "
                    f"platform/SQL floor = {platform_vs_floor[-1]:.2f}",
                    flush=True,
                )
        print(
            f"platform/plain on RabbitMQ: median {statistics.median(vs_plain):.2f} "
            f"(min {min(vs_plain):.2f}, max {max(vs_plain):.2f}) over {args.runs} runs"
        )
        print(
            f"platform/plain on RabbitMQ, jobs per busy CPU second: median "
            f"{statistics.median(cpu_vs_plain):.2f} (min {min(cpu_vs_plain):.2f}, "
            f"max {max(cpu_vs_plain):.2f})"
        )
        print(
            "platform minus plain on RabbitMQ, busy CPU per job by part (median, us): "
            + ", ".join(
                f"{part} {statistics.median(gap_by_part[part]) * 1e6:+.0f}" for part in PARTS
            )
        )
        print(
            f"platform RabbitMQ/Redis: median {statistics.median(vs_redis):.2f} "
            f"(min {min(vs_redis):.2f}, max {max(vs_redis):.2f})"
        )
        for label, ratios in (
            ("SQL floor/plain", floor_vs_plain),
            ("platform/SQL floor", platform_vs_floor),
        ):
            if ratios:
                print(
                    f"{label} on RabbitMQ: median {statistics.median(ratios):.2f} "
                    f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
                )


if __name__ == "__main__":
    main()
