"""Static ``jobs docs`` against the runtime ``jobs list`` on a generated tree of job files.

Generates N job files (default 2,000) under ``beat_schedules/`` in a temporary project,
then runs both real console-script commands, each in a fresh interpreter, alternating
so that background load hits both alike:

* static:  ``platform-tasks jobs docs --format json --output /dev/null``
* runtime: ``platform-tasks jobs list --format json`` (imports every job file as beat does)

Before measuring, the platform-tasks package itself is byte-compiled (``compileall``), as
an installed package is: an editable checkout run with ``PYTHONDONTWRITEBYTECODE`` set
would otherwise recompile every edited module on every run and charge that to whichever
command imports it.

The runtime command runs twice per round: *warm* (bytecode of the job files cached in
``__pycache__``, as on a long-lived host) and *cold* (no bytecode cache and none written,
as on a fresh CI checkout). Both run in the project directory with no ``PYTHONPATH``:
``jobs list`` puts the working directory on ``sys.path`` (as ``celery -A`` does), so the
job files' ``from beat_schedules._common import ...`` resolves.

Each command is started by a small meter process that reports the command's wall
time, CPU time (user + system) and peak RSS from ``resource.getrusage(RUSAGE_CHILDREN)``
(its only child is the command). Usage::

    .venv/bin/python bench/jobdocs_static_vs_runtime.py [--files 2000] [--repeat 7]
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
from pathlib import Path

METER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
if done.returncode:
    sys.stderr.write(done.stderr.decode())
    sys.exit(done.returncode)
print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "maxrss_mib": usage.ru_maxrss / 1024, "stdout": done.stdout.decode()}))
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


def compile_package() -> None:
    """Bring the package's own bytecode up to date, as ``pip install`` leaves it."""
    import platform_tasks

    package = Path(platform_tasks.__file__).parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)


def base_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_") and k != "PYTHONPATH"
    }


def measure(command: list[str], cwd: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", METER, *command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def clear_bytecode(project: Path) -> None:
    for cache in project.rglob("__pycache__"):
        shutil.rmtree(cache)


def summarise(rows: list[dict[str, object]]) -> dict[str, float]:
    summary: dict[str, float] = {}
    for key in ("wall_s", "cpu_s", "maxrss_mib"):
        values = [float(row[key]) for row in rows]  # type: ignore[arg-type]
        summary[f"{key}_min"] = round(min(values), 3)
        summary[f"{key}_median"] = round(statistics.median(values), 3)
        summary[f"{key}_max"] = round(max(values), 3)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    script = str(Path(sys.executable).parent / "platform-tasks")
    static_cmd = [script, "jobs", "docs", "--format", "json", "--output", os.devnull]
    runtime_cmd = [script, "jobs", "list", "--format", "json"]
    compile_package()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="jobdocs-bench-") as tmp:
        project = Path(tmp)
        generate(project, options.files)
        static_env = base_env()
        runtime_env = base_env()
        warm_env = {k: v for k, v in runtime_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cold_env = {**runtime_env, "PYTHONDONTWRITEBYTECODE": "1"}

        # Correctness first: both commands see all the jobs, and the static run is clean.
        document = json.loads(
            subprocess.run(
                [script, "jobs", "docs", "--format", "json"],
                cwd=project,
                env=static_env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        listed = json.loads(str(measure(runtime_cmd, project, warm_env)["stdout"]))
        assert len(document["jobs"]) == options.files, len(document["jobs"])
        assert all(job["evidence"] == "complete" for job in document["jobs"])
        assert len(listed) == options.files, len(listed)
        assert all(len(row["next_points"]) == 3 for row in listed)

        static, warm, cold = [], [], []
        for _ in range(options.repeat):
            static.append(measure(static_cmd, project, static_env))
            warm.append(measure(runtime_cmd, project, warm_env))
            clear_bytecode(project)
            cold.append(measure(runtime_cmd, project, cold_env))
            measure(runtime_cmd, project, warm_env)  # rewrite the bytecode cache
    results = {
        "files": options.files,
        "repeat": options.repeat,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "static_jobs_docs": summarise(static),
        "runtime_jobs_list_warm": summarise(warm),
        "runtime_jobs_list_cold": summarise(cold),
    }
    s = results["static_jobs_docs"]
    for name in ("runtime_jobs_list_warm", "runtime_jobs_list_cold"):
        r = results[name]
        assert isinstance(s, dict) and isinstance(r, dict)
        results[f"ratio_{name}"] = {
            key: round(r[key] / s[key], 2)
            for key in ("wall_s_median", "wall_s_min", "cpu_s_median", "maxrss_mib_median")
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
