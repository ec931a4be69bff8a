"""PlatformTask against plain Celery on RabbitMQ, the two workers taking turns every few
seconds.

Usage: .venv/bin/python bench/rabbitmq_alternating.py [--segment-jobs 2000] [--pairs 10]
       [--runs 3]

Why a second benchmark of the same ratio: ``bench/rabbitmq_throughput.py`` drains each
variant once per run, about a minute apart, and this machine's speed moves more than the
code's difference within that minute: in one invocation the same PlatformTask drained at
464 and at 706 jobs/s, every process of the machine (worker, PostgreSQL, RabbitMQ) using
a third more CPU per job in the slow one. Single-run ratios spread from 0.65 to 1.14.

Here both queues are filled and both workers (the same ``-P prefork -c 2`` worker of
``bench/consumer_app.py`` as there) are started once, then take turns: one worker's
process group is resumed (``SIGCONT``) while the other's is stopped (``SIGSTOP``), for
``--segment-jobs`` jobs, then they swap. Each pair of adjacent segments gives a ratio
taken seconds apart, and the order within a pair alternates, so a change of the machine's
speed falls on both variants alike far more often than in a whole-variant run.

A segment is counted from its queue (ready messages, read with a passive declare over
AMQP), not from rows, which would scan a growing table while the worker runs. A stopped
worker holds at most its prefetch (two messages) unacknowledged, far from the harness's
``consumer_timeout`` (30 minutes). Before each segment the machine must be idle (under
10 % busy over half a second). Each worker first takes ``--warm`` jobs, not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import kombu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rabbitmq_throughput import (  # noqa: E402
    bench_servers,
    cpu_busy,
    cpu_ticks,
    fill,
    settle,
    worker_argv,
    worker_env,
)
from platform_tasks.testing.servers import wait_until  # noqa: E402
from tests.support.servers import RabbitMQServer  # noqa: E402

PLAIN, PLATFORM = "bench.plain", "bench.platform"


class TakingTurns:
    """One worker per variant, each in a process group of its own, stopped between turns."""

    def __init__(self, broker: kombu.Connection, env: dict[str, str], log: Path) -> None:
        self.channel = broker.default_channel
        self.env = env
        self.log = log
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.queues: dict[str, str] = {}

    def ready(self, variant: str) -> int:
        _, count, _ = self.channel.queue_declare(self.queues[variant], passive=True)
        return int(count)

    def start(self, variant: str, queue: str, warm: int) -> None:
        """Start the variant's worker, let it take ``warm`` jobs, then stop it."""
        self.queues[variant] = queue
        before = self.ready(variant)
        with open(self.log, "ab") as out:
            self.workers[variant] = subprocess.Popen(
                worker_argv(queue, node=f"{variant}@%h"),
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(
            lambda: self.ready(variant) <= before - warm,
            timeout=120,
            interval=0.02,
            message=f"the {variant} worker to take its first jobs",
        )
        os.killpg(self.workers[variant].pid, signal.SIGSTOP)

    def segment(self, variant: str, jobs: int) -> tuple[int, float, float]:
        """Resume the variant's worker for at least ``jobs`` jobs: (jobs taken, seconds,
        busy CPU seconds per job)."""
        wait_until(
            lambda: cpu_busy() < 0.10, timeout=120, interval=0.1, message="the machine to be idle"
        )
        before = self.ready(variant)
        ticks = cpu_ticks()[0]
        start = time.perf_counter()
        os.killpg(self.workers[variant].pid, signal.SIGCONT)
        try:
            wait_until(lambda: self.ready(variant) <= before - jobs, timeout=600, interval=0.02)
            elapsed = time.perf_counter() - start
            busy = (cpu_ticks()[0] - ticks) / os.sysconf("SC_CLK_TCK")
            done = before - self.ready(variant)
        finally:
            os.killpg(self.workers[variant].pid, signal.SIGSTOP)
        return done, elapsed, busy / done

    def stop(self) -> None:
        for proc in self.workers.values():
            for signum in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)
            proc.wait(30)


def one_run(
    run: int, args: argparse.Namespace, mq: RabbitMQServer, redis_url: str, db_url: str, log: Path
) -> tuple[list[float], float]:
    """(pair ratios, ratio of the two variants' pooled rates) of one run."""
    env = worker_env(mq.url, redis_url, db_url)
    jobs = args.warm + args.pairs * args.segment_jobs + 1000
    queues = {variant: f"alt_{variant.split('.')[1]}_{run}" for variant in (PLAIN, PLATFORM)}
    for variant, queue in queues.items():
        fill(variant, queue, jobs, env)
    wait_until(
        lambda: cpu_busy() < 0.10,
        timeout=120,
        interval=0.1,
        message="the machine to be idle after the fill",
    )
    ratios: list[float] = []
    done = {PLAIN: [0.0, 0.0], PLATFORM: [0.0, 0.0]}  # jobs, seconds
    with kombu.Connection(mq.url) as broker:
        turns = TakingTurns(broker, env, log)
        try:
            for variant, queue in queues.items():
                turns.start(variant, queue, args.warm)
            for pair in range(1, args.pairs + 1):
                order = (PLAIN, PLATFORM) if pair % 2 else (PLATFORM, PLAIN)
                rate, cpu = {}, {}
                for variant in order:
                    taken, seconds, cpu[variant] = turns.segment(variant, args.segment_jobs)
                    rate[variant] = taken / seconds
                    done[variant][0] += taken
                    done[variant][1] += seconds
                ratios.append(rate[PLATFORM] / rate[PLAIN])
                print(
                    f"run {run} pair {pair}: plain {rate[PLAIN]:.0f} jobs/s "
                    f"({cpu[PLAIN] * 1e6:.0f} us busy CPU/job), platform "
                    f"{rate[PLATFORM]:.0f} jobs/s ({cpu[PLATFORM] * 1e6:.0f} us), "
                    f"platform/plain {ratios[-1]:.2f}",
                    flush=True,
                )
        finally:
            turns.stop()
    for queue in queues.values():
        settle(mq.url, queue, db_url)
    pooled = (done[PLATFORM][0] / done[PLATFORM][1]) / (done[PLAIN][0] / done[PLAIN][1])
    return ratios, pooled


def bootstrap_interval(values: list[float], rounds: int = 20000) -> tuple[float, float]:
    """95 % bootstrap interval of the median of ``values`` (a fixed seed: reruns agree)."""
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(rounds * 0.025)], medians[int(rounds * 0.975)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segment-jobs", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", type=int, default=500)
    args = parser.parse_args()
    with bench_servers("bench-rabbitmq-alt-") as (base, rs, pg, mq):
        ratios: list[float] = []
        for run in range(1, args.runs + 1):
            run_ratios, pooled = one_run(run, args, mq, rs.url, pg.url, base / "worker.log")
            ratios += run_ratios
            print(
                f"run {run}: platform/plain median of pairs {statistics.median(run_ratios):.2f}"
                f", of the pooled rates {pooled:.2f}",
                flush=True,
            )
        low, high = bootstrap_interval(ratios)
        print(
            f"platform/plain on RabbitMQ, {len(ratios)} pairs: median "
            f"{statistics.median(ratios):.2f} (95 % interval {low:.2f}-{high:.2f}; "
            f"min {min(ratios):.2f}, max {max(ratios):.2f}; "
            f"{sum(r >= 0.85 for r in ratios)} pairs at or above 0.85)"
        )


if __name__ == "__main__":
    main()
