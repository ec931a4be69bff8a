"""Reading files in several processes gives the report of a single-process run, byte for
byte, including cross-file checks (duplicate names) and per-file failures."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from platform_tasks.jobdocs import build_report, load_docs_config, render_json, report_to_dict
from platform_tasks.jobdocs.evidence import FieldEvidence, FieldState, JobEvidence
from platform_tasks.jobdocs.render_json import json_job_renderer
from platform_tasks.jobdocs.report import (
    PARALLEL_MIN_FILES,
    _analyse_chunk,
    _prerender,
    default_workers,
)
from platform_tasks.jobdocs.resolve import Resolver
from platform_tasks.jobdocs.sources import SourceIndex
from platform_tasks.jobs.selection import path_label
from tests.unit.jobdocs.conftest import CASES, FIXTURES, job_source

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _mixed_tree(make_project: Callable[..., Path]) -> Path:
    files = {
        "beat_schedules/_common.py": 'NIGHTLY = "0 3 * * *"\nZONE = "Europe/Berlin"\n',
        "beat_schedules/_wrap.py": (
            "from platform_tasks.jobs import define_job\n\n"
            "def make(**kw):\n    return define_job(**kw)\n"
        ),
    }
    for i in range(41):
        folder = f"beat_schedules/team_{i % 3}"
        if i % 7 == 3:
            text = "def broken(:\n"
        elif i % 7 == 5:
            text = (
                "from beat_schedules._wrap import make\n\nmake(handler=print, cron='* * * * *')\n"
            )
        elif i % 5 == 0:
            text = job_source('name="same", cron="0 * * * *"')  # duplicates across slices
        elif i % 2:
            text = "from beat_schedules._common import NIGHTLY, ZONE\n" + job_source(
                "cron=NIGHTLY, timezone=ZONE, queue=-0.0"
            )
        else:
            text = "from datetime import timedelta\n" + job_source(
                f"interval=timedelta(minutes={i}), enabled={i % 3 == 0}"
            )
        files[f"{folder}/job_{i:03d}.py"] = text
    return make_project(files)


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_parallel_and_serial_reports_are_identical(
    make_project: Callable[..., Path], workers: int
) -> None:
    config = load_docs_config(_mixed_tree(make_project), "development", {})

    serial = build_report(config, workers=1)
    parallel = build_report(config, workers=workers)

    assert render_json(parallel) == render_json(serial)
    assert parallel.problems == serial.problems
    assert len(serial.jobs) > 20 and serial.files_without_evidence and serial.errors


@pytest.mark.parametrize("case", CASES)
def test_fixture_cases_agree_in_parallel(case: str) -> None:
    config = load_docs_config(FIXTURES / case, "development", {})

    assert render_json(build_report(config, workers=4)) == render_json(
        build_report(config, workers=1)
    )


def test_workers_default_to_one_below_the_threshold() -> None:
    assert default_workers(PARALLEL_MIN_FILES - 1) == 1
    assert 1 <= default_workers(PARALLEL_MIN_FILES) <= (os.cpu_count() or 1)


def test_labels_match_the_shared_selection_rule(make_project: Callable[..., Path]) -> None:
    config = load_docs_config(_mixed_tree(make_project), "development", {})

    for job in build_report(config, workers=1).jobs:
        file = config.project_dir.absolute() / job.file
        assert job.path_label == path_label(config.jobs_dir, file)


def test_job_writer_matches_the_generic_document() -> None:
    from platform_tasks.jobdocs.evidence import ProjectState, ProjectStateName, Report

    values: list[object] = [True, 1, 1.0, -0.0, 0.0, 0, None, "x\u00e9\n", float("nan")]
    jobs = [
        JobEvidence(
            file=f"f{i}.py",
            path_label=f"f{i}",
            line=1,
            fields={
                name: FieldEvidence(FieldState.KNOWN, value)  # type: ignore[arg-type]
                for name in ("name", "cron", "interval", "timezone", "enabled", "lease_ttl")
            }
            | {"queue": FieldEvidence(FieldState.ABSENT, value)},  # type: ignore[arg-type]
            gaps=["gap"] if i % 2 else [],
        )
        for i, value in enumerate(values)
    ]
    report = Report("development", ProjectState(ProjectStateName.UNKNOWN, []), jobs, [], [])

    expected = json.dumps(report_to_dict(report), indent=2, ensure_ascii=False) + "\n"
    assert render_json(report) == expected


def test_one_file_batches_interleave_and_come_back_in_order(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from platform_tasks.jobdocs import parallel as parallel_module

    monkeypatch.setattr(parallel_module, "_MIN_BATCH", 1)
    config = load_docs_config(_mixed_tree(make_project), "development", {})

    serial = build_report(config, workers=1)
    parallel = build_report(config, workers=3)

    assert render_json(parallel) == render_json(serial)
    assert parallel.problems == serial.problems


def test_batches_taken_by_a_failing_child_are_read_again(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A child that dies after finishing one batch and claiming another is not trusted:
    the parent drops what it had read from it and reads all of those files itself."""
    from platform_tasks.jobdocs import parallel as parallel_module
    from platform_tasks.jobdocs import report as report_module
    from platform_tasks.testing.servers import wait_until

    monkeypatch.setattr(parallel_module, "_MIN_BATCH", 1)
    parent = os.getpid()
    first, second = tmp_path / "child-finished-one", tmp_path / "child-claimed-another"
    real_chunk = report_module._analyse_chunk
    read_here: list[str] = []

    def chunk(resolver: object, root: str, files: list[str]) -> object:
        if os.getpid() != parent:
            if first.exists():
                second.touch()
                raise RuntimeError("child lost")
            first.touch()
        else:
            # Hold the parent's first batch until the child has done one and died.
            wait_until(second.exists, timeout=30, interval=0.005, message="child fails")
            read_here.extend(files)
        return real_chunk(resolver, root, files)  # type: ignore[arg-type]

    monkeypatch.setattr(report_module, "_analyse_chunk", chunk)
    project = _mixed_tree(make_project)
    config = load_docs_config(project, "development", {})

    parallel = build_report(config, workers=2)
    monkeypatch.setattr(report_module, "_analyse_chunk", real_chunk)
    serial = build_report(config, workers=1)

    assert second.exists()
    assert render_json(parallel) == render_json(serial)
    assert parallel.problems == serial.problems
    selected = [str(project.absolute() / job.file) for job in serial.jobs]
    selected += [str(project.absolute() / item.file) for item in serial.files_without_evidence]
    assert sorted(read_here) == sorted(selected)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_prerendered_jobs_render_exactly_like_the_report(
    make_project: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Entries written by the reading processes are redone when a job gains a problem
    afterwards: a cron check settled by the parent, a name found twice across files."""
    from platform_tasks.jobdocs import parallel as parallel_module
    from platform_tasks.jobdocs import render_markdown

    monkeypatch.setattr(parallel_module, "_MIN_BATCH", 1)
    project = _mixed_tree(make_project)
    for i in range(6):
        bad = job_source(f"name='bad_cron_{i}', cron='0 0 30 2 *'")
        (project / "beat_schedules" / f"late_{i}.py").write_text(bad)
    config = load_docs_config(project, "development", {})

    plain = build_report(config, workers=1)
    as_json = build_report(config, workers=workers, prerender="json")
    as_markdown = build_report(config, workers=workers, prerender="markdown")

    assert as_json.prerendered is not None and as_json.prerendered[0] == "json"
    assert len(as_json.prerendered[1]) == len(plain.jobs)
    assert render_json(as_json) == render_json(plain)
    assert render_markdown(as_markdown) == render_markdown(plain)
    assert any("no representable future point" in r for j in plain.jobs for r in j.reasons)


def test_prerender_names_a_known_format(make_project: Callable[..., Path]) -> None:
    config = load_docs_config(_mixed_tree(make_project), "development", {})

    with pytest.raises(ValueError, match="prerender must be one of"):
        build_report(config, prerender="yaml")


def test_prerendered_entries_of_many_unnamed_jobs_stay_their_own(
    make_project: Callable[..., Path],
) -> None:
    """Children free each batch once written, so a freed job's evidence may leave its
    memory address to the next one: an entry must never be taken for another's."""
    files = {
        f"beat_schedules/team_{i % 4}/job_{i:04d}.py": "from datetime import timedelta\n"
        + job_source(f"interval=timedelta(minutes={1 + i % 50})")
        for i in range(600)
    }
    config = load_docs_config(make_project(files), "development", {})

    plain = render_json(build_report(config, workers=1))

    assert render_json(build_report(config, workers=2, prerender="json")) == plain


def test_only_batches_written_in_full_are_read_back() -> None:
    import pickle

    from platform_tasks.jobdocs.parallel import _HEADER, _ChildResults

    results: _ChildResults[str] = _ChildResults()
    finished: list[list[str]] = []
    done: dict[int, list[str]] = {}
    try:
        results.write(0, ["a", "b"])
        payload = pickle.dumps((1, ["c"]))
        os.write(results.fd, len(payload).to_bytes(_HEADER, "little") + payload[:5])

        results.collect(done, finished.append)
        assert done == {0: ["a", "b"]} and finished == [["a", "b"]]

        os.write(results.fd, payload[5:])
        results.collect(done, finished.append)
        assert done == {0: ["a", "b"], 1: ["c"]} and finished[-1] == ["c"]

        results.forget(done)
        assert done == {}
    finally:
        os.close(results.fd)


def test_an_analysis_survives_the_trip_from_a_child(make_project: Callable[..., Path]) -> None:
    """What a child sends back (pickled with the analysis's own reduction) is every part of
    what it read: jobs with their fields, gaps and problems, pending cron checks, texts and
    the reasons of a file without evidence."""
    project = make_project(
        {
            "beat_schedules/_wrap.py": (
                "from platform_tasks.jobs import define_job\n\n"
                "def make(**kw):\n    return define_job(**kw)\n"
            ),
            "beat_schedules/a.py": job_source('cron="61 * * * *", name="bad name"'),
            "beat_schedules/b.py": job_source("interval=timedelta(minutes=5), **extra"),
            "beat_schedules/c.py": "def broken(:\n",
            "beat_schedules/d.py": (
                "from beat_schedules._wrap import make\n\nmake(handler=print, cron='* * * * *')\n"
            ),
        }
    )
    config = load_docs_config(project, "development", {})
    index = SourceIndex(config.project_dir, list(config.source_roots))
    root = str(config.jobs_dir.absolute())
    files = sorted(str(p) for p in config.jobs_dir.glob("[a-z].py"))
    analyses = _analyse_chunk(Resolver(index), root, files)
    _prerender(analyses, json_job_renderer())

    back = pickle.loads(pickle.dumps(analyses, protocol=pickle.HIGHEST_PROTOCOL))

    def parts(analysis: object) -> tuple[object, ...]:
        return tuple(getattr(analysis, slot) for slot in type(analysis).__slots__)  # type: ignore[attr-defined]

    assert [parts(a) for a in back] == [parts(a) for a in analyses]
    assert all(type(job) is JobEvidence for a in back for job in a.jobs)
    # the file set covers each part: problems, gaps, pending crons, texts, no evidence
    assert any(job.problems for a in back for job in a.jobs)
    assert any(job.gaps for a in back for job in a.jobs)
    assert any(a.pending_crons for a in back)
    assert all(a.texts is not None for a in back)
    assert sum(a.without_evidence is not None for a in back) == 2
