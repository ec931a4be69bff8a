"""Beat with 5,000 active jobs: LeaseScheduler x3 replicas vs stock Celery beat.

Run: .venv/bin/python bench/beat_admission.py [--jobs 5000] [--seconds 40]

Both schedulers run as real ``celery beat`` processes against one real Redis (also the
broker) with the same schedule: intervals of 5/10/15/20/30 s. Stock beat
(PersistentScheduler, one process: it cannot be replicated) runs first, then three
LeaseScheduler replicas together. Measured per scheduler:

* admission round trips per point: script calls counted by Redis (INFO commandstats)
  divided by points considered by all replicas (target 1);
* CPU per busy tick and per triggered point (getrusage of each beat process);
* lateness, publish time minus the point, p50/p99.

Nothing consumes the tasks; the queue is flushed between the phases.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench._servers import bench_redis
from platform_tasks.testing.servers import wait_until

REPO = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")
JOB = """from datetime import timedelta
from platform_tasks.jobs import define_job
def run(ctx): pass
define_job(handler=run, interval=timedelta(seconds={interval}))
"""
INTERVALS = (5, 10, 15, 20, 30)


def write_jobs(root: Path, count: int) -> None:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"job{i:05d}.py").write_text(JOB.format(interval=INTERVALS[i % len(INTERVALS)]))


def script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_phase(
    kind: str, replicas: int, env: dict[str, str], seconds: float, work: Path, client: redis.Redis
) -> dict:
    out = str(work / f"out-{kind}")
    env = dict(env, BENCH_OUT=out, BENCH_STOCK="1" if kind == "stock" else "0")
    procs, logs = [], []
    for i in range(replicas):
        log = work / f"{kind}{i}.log"
        logs.append(log)
        with open(log, "wb") as handle:
            procs.append(
                subprocess.Popen(
                    [
                        CELERY,
                        "-A",
                        "bench.beat_app",
                        "beat",
                        "--loglevel",
                        "WARNING",
                        "-s",
                        str(work / f"{kind}{i}-schedule"),
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                )
            )
    marker = "LocalTime"  # printed once the scheduler is built (after setup_schedule)
    env_ready = [False] * replicas

    def started() -> bool:
        for i, log in enumerate(logs):
            if procs[i].poll() is not None:
                raise RuntimeError(log.read_text()[-3000:])
            env_ready[i] = env_ready[i] or marker in log.read_text(errors="replace")
        return all(env_ready)

    # Beat prints its banner after setup_schedule(): discovery and validation are done.
    wait_until(started, timeout=180, interval=0.2, message=f"{kind} beat start-up")
    calls_before = script_calls(client)
    began = time.monotonic()
    wait_until(
        lambda: time.monotonic() - began >= seconds,
        timeout=seconds + 5,
        interval=0.5,
        message="phase duration",
    )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)
    calls = script_calls(client) - calls_before
    summaries = [json.loads(Path(p).read_text()) for p in glob.glob(f"{out}.*.json")]
    lateness = [v for s in summaries for v in s["lateness_ms"]]
    triggered = len(lateness)
    cpu = sum(s["cpu_s"] for s in summaries)
    busy = (
        sum(s["busy_ticks"] for s in summaries)
        if kind == "lease"
        else sum(s["ticks"] for s in summaries)
    )
    points = sum(s["points"] for s in summaries)
    return {
        "kind": kind,
        "replicas": replicas,
        "triggered": triggered,
        "points": points,
        "script_calls": calls,
        "cpu_s": cpu,
        "busy_ticks": busy,
        "p50_ms": percentile(lateness, 0.50),
        "p99_ms": percentile(lateness, 0.99),
        "max_ms": max(lateness) if lateness else float("nan"),
        "mean_ms": statistics.fmean(lateness) if lateness else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-beat-"))
    write_jobs(work / "jobs", args.jobs)
    with bench_redis() as server:
        client = redis.Redis.from_url(server.url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
        env.update(
            PLATFORM_REDIS_URL=server.url,
            PLATFORM_PROFILE="bench",
            PLATFORM_JOBS_DIR=str(work / "jobs"),
            BENCH_JOBS=str(args.jobs),
            # keep the delay promoter's script calls out of the admission count
            PLATFORM_DELAY_POLL_INTERVAL_SECONDS="60",
        )
        stock = run_phase("stock", 1, env, args.seconds, work, client)
        client.flushall()
        lease = run_phase("lease", 3, env, args.seconds, work, client)
        client.close()
    rows = [stock, lease]
    print(f"jobs={args.jobs} seconds={args.seconds}")
    print(
        "scheduler | replicas | triggered | points considered | admission calls/point | "
        "CPU s | CPU ms/busy tick | CPU us/triggered | lateness p50 ms | p99 ms | max ms"
    )
    for r in rows:
        per_point = r["script_calls"] / r["points"] if r["points"] else float("nan")
        print(
            f"{r['kind']} | {r['replicas']} | {r['triggered']} | {r['points']} | "
            f"{per_point:.3f} | {r['cpu_s']:.2f} | "
            f"{1000 * r['cpu_s'] / max(1, r['busy_ticks']):.1f} | "
            f"{1e6 * r['cpu_s'] / max(1, r['triggered']):.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f}"
        )
    cpu_ratio = (lease["cpu_s"] / max(1, lease["triggered"])) / (
        stock["cpu_s"] / max(1, stock["triggered"])
    )
    print(
        f"ratios lease/stock: CPU per triggered point {cpu_ratio:.2f}x, "
        f"p50 lateness {lease['p50_ms'] / stock['p50_ms']:.2f}x, "
        f"p99 lateness {lease['p99_ms'] / stock['p99_ms']:.2f}x"
    )


if __name__ == "__main__":
    main()
