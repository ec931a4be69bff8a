"""Static ``jobs docs`` against runtime discovery on a generated tree of job files.

Generates N job files (default 2,000) under ``beat_schedules/`` in a temporary project,
then runs, each in a fresh interpreter so neither inherits the other's imports:

* static: ``platform-tasks jobs docs --format json`` (the real console script);
* runtime: ``platform_tasks.jobs.discovery.discover_jobs`` — the import-every-file
  discovery beat and the workers use (there is no runtime ``jobs list`` command yet).

Wall time is measured around the subprocess (interpreter start-up included); peak
memory is the child's ``ru_maxrss``. Usage::

    .venv/bin/python bench/jobdocs_static_vs_runtime.py [--files 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNTIME_CHILD = """
import json, resource, sys, time
from datetime import datetime, timezone
from pathlib import Path
sys.path.insert(0, sys.argv[1])
start = time.perf_counter()
from platform_tasks.jobs.discovery import discover_jobs
jobs = discover_jobs(Path(sys.argv[1]) / "beat_schedules", now=datetime.now(timezone.utc))
elapsed = time.perf_counter() - start
print(json.dumps({"jobs": len(jobs.jobs), "inner_s": elapsed,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

STATIC_CHILD = """
import json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
from platform_tasks.jobdocs import build_report, load_docs_config, render_json
report = build_report(load_docs_config(Path(sys.argv[1]), "development", {}))
render_json(report)
elapsed = time.perf_counter() - start
print(json.dumps({"jobs": len(report.jobs), "inner_s": elapsed, "errors": len(report.errors),
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

JOB_CRON = """from beat_schedules._common import NIGHTLY, ZONE
from platform_tasks.jobs import define_job


def run(ctx):
    ctx.logger.info("job {i}")


define_job(handler=run, cron=NIGHTLY, timezone=ZONE, queue="bench.q{q}")
"""

JOB_INTERVAL = """from datetime import timedelta

from platform_tasks.jobs import define_job


def run(ctx):
    ctx.logger.info("job {i}")


define_job(handler=run, interval=timedelta(minutes={m}), lease_ttl=timedelta(minutes=1))
"""


def generate(project: Path, count: int) -> None:
    jobs = project / "beat_schedules"
    jobs.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.platform-tasks]\nsource_roots = ["beat_schedules"]\n\n'
        '[tool.platform-tasks.profiles.development]\nredis_url = "redis://127.0.0.1:6379/0"\n'
    )
    (jobs / "_common.py").write_text('NIGHTLY = "0 3 * * *"\nZONE = "Europe/Berlin"\n')
    for i in range(count):
        folder = jobs / f"team_{i % 20:02d}"
        folder.mkdir(exist_ok=True)
        template = JOB_CRON if i % 2 else JOB_INTERVAL
        text = template.format(i=i, q=i % 7, m=5 + i % 50)
        (folder / f"job_{i:05d}.py").write_text(text)


def run_child(args: list[str], cwd: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    start = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def cli_wall(project: Path) -> float:
    script = Path(sys.executable).parent / "platform-tasks"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    start = time.perf_counter()
    subprocess.run(
        [str(script), "jobs", "docs", "--format", "json", "--output", os.devnull],
        cwd=project, env=env, capture_output=True, check=True,
    )  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobdocs-bench-") as tmp:
        project = Path(tmp)
        generate(project, options.files)
        static, runtime, cold, cli = [], [], [], []
        for _ in range(options.repeat):
            static.append(run_child([sys.executable, "-c", STATIC_CHILD, tmp], project))
            # Cold: a fresh checkout (CI) has no bytecode cache for the job files.
            for cache in project.rglob("__pycache__"):
                shutil.rmtree(cache)
            cold.append(run_child([sys.executable, "-B", "-c", RUNTIME_CHILD, tmp], project))
            # Warm: the bytecode cache written by an earlier import is reused.
            run_child([sys.executable, "-c", RUNTIME_CHILD, tmp], project)
            runtime.append(run_child([sys.executable, "-c", RUNTIME_CHILD, tmp], project))
            cli.append(cli_wall(project))
    assert all(r["jobs"] == options.files for r in static + runtime + cold), (static, runtime)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    summary = {
        "files": options.files,
        "repeat": options.repeat,
        "static_cli_wall_s": statistics.median(cli),
        "static_wall_s": med(static, "wall_s"),
        "static_inner_s": med(static, "inner_s"),
        "static_maxrss_mib": med(static, "maxrss_kib") / 1024,
        "runtime_cold_wall_s": med(cold, "wall_s"),
        "runtime_cold_inner_s": med(cold, "inner_s"),
        "runtime_cold_maxrss_mib": med(cold, "maxrss_kib") / 1024,
        "runtime_wall_s": med(runtime, "wall_s"),
        "runtime_inner_s": med(runtime, "inner_s"),
        "runtime_maxrss_mib": med(runtime, "maxrss_kib") / 1024,
    }
    summary["speedup_wall"] = summary["runtime_wall_s"] / summary["static_wall_s"]
    summary["speedup_inner"] = summary["runtime_inner_s"] / summary["static_inner_s"]
    summary["speedup_cold_wall"] = summary["runtime_cold_wall_s"] / summary["static_wall_s"]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
