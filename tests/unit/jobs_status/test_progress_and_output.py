"""Progress is rate-limited per job by an injected clock; output is capped and JSON only."""

from __future__ import annotations

from typing import Any, cast

import pytest

from platform_tasks.errors import OutputRefused, PermanentError
from platform_tasks.jobs_status.output import encode_output
from platform_tasks.jobs_status.running import JobMarker, RunningMarkers, report_progress


class Recorder(RunningMarkers):
    """RunningMarkers whose writes are recorded instead of sent (the pure rate limit)."""

    def __init__(self) -> None:
        super().__init__(lambda: None, "test")
        self.writes: list[tuple[str, Any]] = []

    def start(self, job_id: str, **fields: Any) -> None:
        self.writes.append(("start", fields))

    def progress(self, job_id: str, fields: dict[str, Any]) -> None:
        self.writes.append(("progress", fields["done"]))

    def end(self, job_id: str, *, applied: bool = False) -> None:
        self.writes.append(("end", job_id, applied))


def test_a_tight_loop_writes_once_per_interval() -> None:
    now = [100.0]
    markers = Recorder()
    marker = JobMarker(markers, "j", clock=lambda: now[0])
    marker.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    with marker.reporting():
        written = [report_progress(done, 1000) for done in range(1000)]
        now[0] += 1.0
        assert report_progress(1000, 1000, "done") is True
    marker.end()
    assert written.count(True) == 1
    assert [w for w in markers.writes if w[0] == "progress"] == [
        ("progress", 0),
        ("progress", 1000),
    ]
    assert markers.writes[-1] == ("end", "j", False)
    assert report_progress(5) is False  # after the job: nothing to report to


def test_progress_outside_a_job_or_with_status_off_stores_nothing() -> None:
    assert report_progress(1, 2, "x") is False
    off = JobMarker(None, "j")
    off.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    with off.reporting():
        assert report_progress(1) is False


def test_progress_refuses_what_is_not_a_number() -> None:
    with pytest.raises(TypeError, match="done must be a number"):
        report_progress(cast(Any, "half"))


def test_output_is_compact_json_within_the_cap() -> None:
    assert encode_output({"rows": 3}, 100) == '{"rows":3}'


def test_output_over_the_cap_is_refused_naming_the_setting_and_size() -> None:
    with pytest.raises(OutputRefused, match=r"101 bytes.*PLATFORM_JOB_OUTPUT_MAX_BYTES=100"):
        encode_output("x" * 99, 100)
    assert issubclass(OutputRefused, PermanentError)  # dead-lettered at once, not retried


def test_output_that_is_not_json_is_refused() -> None:
    with pytest.raises(OutputRefused, match="a set that is not JSON"):
        encode_output({1, 2}, 1000)
    with pytest.raises(OutputRefused, match="not JSON"):
        encode_output(float("nan"), 1000)


def test_an_applied_jobs_marker_goes_with_the_next_start_any_other_at_once() -> None:
    markers = Recorder()
    applied = JobMarker(markers, "a")
    applied.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    applied.applied = True
    applied.end()
    failed = JobMarker(markers, "b")
    failed.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    failed.end()
    assert [w[0] for w in markers.writes] == ["start", "end", "start", "end"]
    assert markers.writes[1] == ("end", "a", True) and markers.writes[3] == ("end", "b", False)
