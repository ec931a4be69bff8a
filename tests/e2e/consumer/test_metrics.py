"""Consumer counters from a prefork worker: the endpoint sums every pool process."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from platform_tasks.testing.servers import free_port, wait_until
from tests.e2e.consumer.faults import count, effect_payload, prepare_effects, producer, start_worker
from tests.support.processes import celery_processes

JOBS = 40
DUPLICATES = 5


def scrape(port: int) -> dict[str, float]:
    """Each sample name summed over its label sets, as read from ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def test_processed_counter_is_summed_across_prefork_processes(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    prepare_effects(database_url)
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    port = free_port()
    # each job holds its transaction a moment, so the two pool processes share the work
    payloads = [effect_payload(hold_ms=50) for _ in range(JOBS)]

    with celery_processes() as started:
        worker = start_worker(
            started,
            redis_url=redis_url,
            database_url=database_url,
            log_path=tmp_path / "worker.log",
            extra_env={
                "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
                "PLATFORM_METRICS_PORT": str(port),
            },
        )
        pool = worker.children()
        assert len(pool) == 2
        with producer(redis_url, database_url) as (_, queue_port):
            for payload in payloads + payloads[:DUPLICATES]:
                queue_port.publish("faults", payload)

        def counted() -> bool:
            totals = scrape(port)
            processed = totals.get("platform_jobs_processed_total")
            skipped = totals.get("platform_jobs_duplicate_skipped_total")
            return processed == JOBS and skipped == DUPLICATES

        try:
            wait_until(counted, timeout=60, interval=0.2, message="counters reach the job count")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {scrape(port)}\n{worker.log()[-4000:]}") from exc
        # both pool processes applied jobs, and the endpoint showed their sum
        writers = {f"counter_{pid}.db" for pid in pool}
        assert writers <= {path.name for path in multiproc_dir.iterdir()}

    assert count(database_url, "public.effects") == JOBS
    assert count(database_url, "core.processed_jobs") == JOBS
