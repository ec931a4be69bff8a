"""``platform-tasks dev``: all starts, samples run, the console answers with the printed
development login (in headless Chromium) and its job search finds the printed samples (by
job id and by their shared correlation id), a job file added while it runs restarts worker
and beat cold and then runs, Ctrl-C cleans up.

``make run`` starts ``dev`` without flags; the test adds some so it can run beside other
tests: ``--flower-port 0`` and ``--console-port 0`` pick free ports (the defaults 5555
and 8000 would collide with a parallel test or a developer's own ``make run``),
``--data-dir`` keeps its Redis, PostgreSQL, logs and login file in the test's private
directory instead of the checkout's ``.data/``, ``--jobs-dir`` points at an empty
directory the test adds a job file to (not the checkout's ``beat_schedules/``), and
``--samples 2`` fixes how many sample ids it waits for.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import psutil
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.console import headless_chromium


class Output:
    """Collects a child's stdout lines in a thread so the test can wait on them."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HELLO_JOB = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    ctx.logger.info("hello from the dev platform at %s", ctx.scheduled_for.isoformat())

job = define_job(handler=run, interval=timedelta(seconds=2))
"""


def _job_rows(web) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The job search page's answer: job id -> state."""
    rows = web.find_elements(By.CSS_SELECTOR, "tr.job-row")
    return {row.get_attribute("data-job"): row.get_attribute("data-state") for row in rows}


def _console_shows_the_queues(output: str, tmp_path: Path, job_ids: tuple[str, ...]) -> None:
    """Log in with the printed development login, see the dead letters and queues, then
    find the (already applied) samples with the job search: the printed link for the
    first one, the search box for their correlation id."""
    console = re.search(r"Console\s+(http://\S+/)", output)
    login = re.search(r"Login\s+(\S+) / (\S+) \(development only", output)
    assert console and login, output
    url, (username, password) = console.group(1), login.groups()
    login_file = tmp_path / "data" / "console-login"
    assert login_file.read_text().strip() == password
    assert login_file.stat().st_mode & 0o077 == 0, "the development password is private"
    with headless_chromium(tmp_path) as web:
        web.get(f"{url}admin/login/")
        web.find_element(By.ID, "id_username").send_keys(username)
        web.find_element(By.ID, "id_password").send_keys(password)
        web.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        WebDriverWait(web, 30).until(expected_conditions.url_to_be(f"{url}admin/"))
        web.get(f"{url}admin/platform_console/deadletter/")
        assert web.find_elements(By.ID, "changelist"), web.page_source[:2000]
        web.get(f"{url}admin/platform_console/queue/")
        queues = [row.text for row in web.find_elements(By.CSS_SELECTOR, "tr.queue-row")]
        assert any(text.startswith("default") for text in queues), queues

        find = re.search(r"Find a job\s+(http://\S+)", output)
        correlation = re.search(r"Samples\s+correlation id (\S+)", output)
        assert find and correlation, output
        assert find.group(1) == f"{url}admin/platform_console/queue/jobs/?q={job_ids[0]}"
        web.get(find.group(1))
        WebDriverWait(web, 30).until(lambda w: w.find_elements(By.ID, "found-count"))
        assert _job_rows(web) == {job_ids[0]: "applied"}, web.page_source[:3000]

        answered = web.find_element(By.ID, "found-count")
        box = web.find_element(By.ID, "id_q")
        box.clear()
        box.send_keys(correlation.group(1))
        web.find_element(By.ID, "find").click()
        WebDriverWait(web, 30).until(expected_conditions.staleness_of(answered))
        WebDriverWait(web, 30).until(lambda w: w.find_elements(By.ID, "found-count"))
        assert _job_rows(web) == dict.fromkeys(job_ids, "applied"), web.page_source[:3000]


def test_dev_runs_everything_and_stops_everything(tmp_path: Path) -> None:
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    env["PYTHONUNBUFFERED"] = "1"
    cli = Path(sys.executable).with_name("platform-tasks")
    os.chmod(tmp_path, 0o755)
    proc = subprocess.Popen(
        [
            str(cli),
            "dev",
            "--data-dir",
            str(tmp_path / "data"),
            "--flower-port",
            "0",
            "--console-port",
            "0",
            "--jobs-dir",
            str(jobs_dir),
            "--samples",
            "2",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = Output(proc.stdout)
    seen: set[int] = set()
    try:
        wait_until(
            lambda: "Ready" in out.text() or proc.poll() is not None,
            timeout=120,
            message="dev platform ready",
        )
        assert proc.poll() is None, out.text()
        flower = re.search(r"Flower\s+(http://\S+)", out.text())
        assert flower, out.text()
        with urllib.request.urlopen(flower.group(1), timeout=5) as response:
            assert response.status == 200
        samples = re.search(r"Samples\s+published 2: (\S+) (\S+)", out.text())
        assert samples, out.text()
        worker_log = tmp_path / "data" / "logs" / "worker.log"
        for job_id in samples.groups():
            wait_until(
                lambda job_id=job_id: f"[{job_id}] succeeded" in worker_log.read_text(),
                timeout=60,
                message=f"sample {job_id} processed",
            )
        _console_shows_the_queues(out.text(), tmp_path, samples.groups())
        seen |= _descendants(proc.pid)
        assert len(seen) >= 7, "redis, postgres, worker (+pool), two beats, flower, console"

        before = _descendants(proc.pid)
        # a new user adds a job while the platform runs, as in the README
        (jobs_dir / "hello.py").write_text(HELLO_JOB)
        wait_until(
            lambda: "Restarted   generation 2" in out.text(),
            timeout=60,
            message="cold restart after a change",
        )
        after = _descendants(proc.pid)
        seen |= after
        replaced = before - after
        assert replaced, "worker and beat processes were replaced, not reused"
        # the restarted beat admits its points and the worker (no -Q) runs the handler
        wait_until(
            lambda: "hello from the dev platform" in worker_log.read_text(),
            timeout=90,
            message="the added job's handler log line in worker.log",
        )
        seen |= _descendants(proc.pid)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, out.text()
        wait_until(
            lambda: not any(_alive(pid) for pid in seen),
            timeout=30,
            message="every started process gone",
        )
        assert "Stopped" in out.text()
        # PostgreSQL's files: kept in --data-dir; a private temporary folder (--data-dir
        # unreachable by the user the cluster runs as) deleted, not left behind per run
        files = re.search(r"PostgreSQL .*\(embedded, files in (\S+)\)", out.text())
        assert files, out.text()
        cluster = Path(files.group(1))
        if cluster.is_relative_to(tmp_path / "data"):
            assert (cluster / "PG_VERSION").exists()
        else:
            assert not cluster.parent.exists(), f"{cluster.parent} left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
