"""Instructions a pool process executes per job, counted by valgrind: plain Celery's INSERT,
the PlatformTask's SQL sent by hand (the SQL floor), the PlatformTask, a no-op.

Usage: .venv/bin/python bench/pool_side_instructions.py [--jobs 1000] [--code DIR]
       (needs ``valgrind``: ``apt-get install valgrind``)

Why a count beside ``bench/pool_side_cpu.py``: CPU time on this machine moves by 10-20 %
between rounds of the same code, which hides a change of a few per cent in the pipeline's
own Python. The number of instructions the process executes moves by a few tenths of a
per cent between runs (other ports and paths): each task runs under ``valgrind
--tool=callgrind`` twice, with ``--jobs`` jobs and without them (both after the same
warm-up and with the same ``PYTHONHASHSEED``), and the difference divided by ``--jobs`` is
its cost per job, start-up and imports cancelled out. It counts user-space
instructions only (the pool process's share of the socket calls is in the kernel and is
not counted), and an instruction is not a fixed time: a job that waits on PostgreSQL three
times runs its Python with colder caches than a loop does. Read it as the size of the code
a job runs, to compare two versions of the platform (``--code`` points at another
checkout, e.g. ``git worktree add /tmp/before HEAD~1``), not as a time.

The jobs go through Celery's tracer as in ``bench/pool_side_cpu.py`` (the tasks of
``bench/consumer_app.py``), against a PostgreSQL and a Redis of the script's own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("bench.plain", "bench.sql_floor", "bench.platform", "bench.noop")
WARM_JOBS = 50
BASE_JOBS = 100
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


def child(task: str, jobs: int) -> None:
    """Run ``jobs`` jobs of ``task`` after the warm-up (the process valgrind counts)."""
    from bench.consumer_app import app
    from bench.pool_side_cpu import run_jobs, tracers

    trace = tracers(app)[task]
    run_jobs(trace, task, WARM_JOBS)
    run_jobs(trace, task, jobs)


def counted(code: Path, task: str, jobs: int, env: dict[str, str], folder: Path) -> int:
    """Instructions of one child process running ``jobs`` jobs of ``task``."""
    out = folder / f"callgrind.{task}.{jobs}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            task,
            str(jobs),
            "--code",
            str(code),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    found = _TOTAL.search(out.read_bytes())
    if found is None:
        raise SystemExit(f"{out}: no instruction total in valgrind's output")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--code",
        type=Path,
        default=ROOT,
        help="the checkout whose platform and bench apps are measured",
    )
    parser.add_argument("--child", nargs=2, metavar=("TASK", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    code = args.code.resolve()
    if args.child:  # the measured checkout's code and bench apps
        sys.path.insert(0, str(code))
        child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    sys.path.insert(0, str(ROOT))  # the servers: this checkout's harness
    from bench.pool_side_cpu import pool_side_servers

    folder = Path(tempfile.mkdtemp(prefix="bench-pool-instructions-"))
    with pool_side_servers("bench-pool-instructions-") as variables:
        env = dict(os.environ, PYTHONPATH=str(code), PYTHONHASHSEED="0", **variables)
        per_job: dict[str, int] = {}
        for task in TASKS:
            without = counted(code, task, BASE_JOBS, env, folder)
            with_jobs = counted(code, task, BASE_JOBS + args.jobs, env, folder)
            per_job[task] = (with_jobs - without) // args.jobs
            print(f"{task:16s} {per_job[task]:>9,} instructions per job")
        print(json.dumps({"code": str(code), "jobs": args.jobs, "per_job": per_job}))


if __name__ == "__main__":
    main()
