"""Progress is rate-limited per job by an injected clock; a job is marked only once it
runs on; output is capped and JSON only."""

from __future__ import annotations

from typing import Any, cast

import pytest

from platform_tasks.errors import OutputRefused, PermanentError
from platform_tasks.jobs_status.output import encode_output
from platform_tasks.jobs_status.running import JobMarker, Running, RunningMarkers, report_progress


class Recorder(RunningMarkers):
    """RunningMarkers whose Redis writes are recorded instead of sent (the pure rules)."""

    def __init__(self, clock: Any) -> None:
        super().__init__(lambda: None, "test", clock=clock, mark_after=0.5, watch=False)
        self.writes: list[tuple[str, Any]] = []

    def _best_effort(self, step: str, call: Any) -> bool:
        self.writes.append((step, None))
        return True


def _progress(markers: Recorder) -> int:
    return sum(1 for step, _ in markers.writes if step in ("start", "progress"))


def test_a_tight_loop_writes_once_per_interval() -> None:
    now = [100.0]
    markers = Recorder(lambda: now[0])
    marker = JobMarker(markers, "j", clock=lambda: now[0])
    marker.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    with marker.reporting():
        written = [report_progress(done, 1000) for done in range(1000)]
        now[0] += 1.0
        assert report_progress(1000, 1000, "done") is True
    marker.end()
    assert written.count(True) == 1
    # the first report writes the marker with it, the second only the progress
    assert [step for step, _ in markers.writes] == ["start", "progress", "end"]
    assert report_progress(5) is False  # after the job: nothing to report to


def test_only_a_job_that_runs_on_is_marked_and_its_marker_goes_with_it() -> None:
    now = [0.0]
    markers = Recorder(lambda: now[0])
    short = JobMarker(markers, "short")
    short.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    long = JobMarker(markers, "long")
    long.start(consumer="c", queue="q", attempt=1, ttl_seconds=60)
    now[0] = 0.4
    assert markers.due() == []
    short.end()  # a short job: nothing written, nothing to delete
    assert markers.writes == []
    now[0] = 0.6
    (due,) = markers.due()
    assert due.job_id == "long"
    markers.mark(due)
    assert markers.due() == []  # marked once
    long.end()
    assert [step for step, _ in markers.writes] == ["start", "end"]


def test_a_job_that_ended_is_not_marked_afterwards() -> None:
    markers = Recorder(lambda: 10.0)
    running = markers.begin("j", consumer="c", queue="q", attempt=1, ttl_seconds=60)
    markers.finish(running)
    markers.mark(running)  # the watcher's late look at a job that just ended
    assert markers.writes == []
    assert isinstance(running, Running) and running.done


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
