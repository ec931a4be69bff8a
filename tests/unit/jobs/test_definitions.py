"""define_job validation and discovery: every error names the file and the field."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from platform_tasks.errors import JobDefinitionError
from platform_tasks.jobs import define_job
from platform_tasks.jobs.definition import DEFAULT_QUEUE
from platform_tasks.jobs.discovery import discover_from_settings, discover_jobs
from platform_tasks.settings import PlatformSettings

NOW = datetime(2025, 1, 1, tzinfo=UTC)
GOOD = """
from datetime import timedelta
from platform_tasks.jobs import define_job
def run(ctx): pass
define_job(handler=run, {args})
"""


def run(ctx: object) -> None:
    """Does nothing."""


def write(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "interval"),
        ({"cron": "* * * * *", "interval": timedelta(minutes=1)}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"interval": 60}, "interval"),
        ({"interval": timedelta(milliseconds=500)}, "interval"),
        ({"interval": timedelta(minutes=1), "timezone": "Europe/Berlin"}, "timezone"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 * * * *", "enabled": "yes"}, "enabled"),
        ({"cron": "0 * * * *", "lease_ttl": 30}, "lease_ttl"),
        ({"cron": "0 * * * *", "queue": ""}, "queue"),
        ({"cron": "0 * * * *", "name": "has space"}, "name"),
        ({"cron": "0 * * * *", "name": "a{b}"}, "name"),
    ],
)
def test_define_job_rejects_bad_arguments_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(JobDefinitionError) as info:
        define_job(handler=run, **kwargs)
    assert info.value.field == field


def test_define_job_rejects_non_callable_handler() -> None:
    with pytest.raises(JobDefinitionError) as info:
        define_job(handler="run", cron="0 * * * *")  # type: ignore[arg-type]
    assert info.value.field == "handler"


def test_defaults() -> None:
    job = define_job(handler=run, cron="0 * * * *")
    assert (job.timezone, job.enabled, job.queue, job.lease_ttl) == (
        "UTC",
        True,
        DEFAULT_QUEUE,
        None,
    )


def test_discovery_infers_names_and_follows_selection_rules(tmp_path: Path) -> None:
    every = GOOD.format(args="interval=timedelta(minutes=5)")
    write(
        tmp_path,
        {
            "billing/nightly.py": every,
            "_private/deep.py": every,
            "_helpers.py": "X = 1\n",
            "test_thing.py": "raise SystemExit\n",
            "thing_test.py": "raise SystemExit\n",
            "conftest.py": "raise SystemExit\n",
            "stub.pyi": "x: int\n",
            "named.py": GOOD.format(args="cron='0 * * * *', name='reports.hourly'"),
        },
    )
    jobs = discover_jobs(tmp_path, now=NOW)
    assert sorted(job.name for job in jobs) == [
        "_private.deep",
        "billing.nightly",
        "reports.hourly",
    ]


def test_include_replaces_defaults_and_exclude_adds(tmp_path: Path) -> None:
    every = GOOD.format(args="interval=timedelta(minutes=5)")
    write(tmp_path, {"a/one.py": every, "b/two.py": every, "b/three.py": every})
    assert [j.name for j in discover_jobs(tmp_path, include=["b/*"], now=NOW)] == [
        "b.three",
        "b.two",
    ]
    assert [j.name for j in discover_jobs(tmp_path, exclude=["b/*"], now=NOW)] == ["a.one"]


@pytest.mark.parametrize("count", [0, 2])
def test_file_with_zero_or_several_definitions_is_an_error(tmp_path: Path, count: int) -> None:
    body = "from datetime import timedelta\nfrom platform_tasks.jobs import define_job\n"
    body += "def run(ctx): pass\n"
    body += "define_job(handler=run, interval=timedelta(minutes=1))\n" * count
    write(tmp_path, {"job.py": body})
    with pytest.raises(JobDefinitionError) as info:
        discover_jobs(tmp_path, now=NOW)
    assert info.value.file == str(tmp_path / "job.py")
    assert f"found {count}" in str(info.value)


def test_duplicate_names_fail_even_when_disabled(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.py": GOOD.format(args="cron='0 * * * *', name='same'"),
            "b.py": GOOD.format(args="cron='0 * * * *', name='same', enabled=False"),
        },
    )
    with pytest.raises(JobDefinitionError) as info:
        discover_jobs(tmp_path, now=NOW)
    assert (info.value.file, info.value.field) == (str(tmp_path / "b.py"), "name")
    assert str(tmp_path / "a.py") in str(info.value)


def test_bad_definition_in_file_names_file_and_field(tmp_path: Path) -> None:
    write(tmp_path, {"bad.py": GOOD.format(args="cron='0 * * * *', timezone='Nowhere/City'")})
    with pytest.raises(JobDefinitionError) as info:
        discover_jobs(tmp_path, now=NOW)
    assert (info.value.file, info.value.field) == (str(tmp_path / "bad.py"), "timezone")
    assert "bad.py" in str(info.value) and "timezone" in str(info.value)


def test_import_error_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, {"broken.py": "import does_not_exist_anywhere\n"})
    with pytest.raises(JobDefinitionError) as info:
        discover_jobs(tmp_path, now=NOW)
    assert info.value.file == str(tmp_path / "broken.py")


def test_active_job_without_future_point_fails(tmp_path: Path) -> None:
    write(tmp_path, {"feb30.py": GOOD.format(args="cron='0 0 30 2 *'")})
    with pytest.raises(JobDefinitionError) as info:
        discover_jobs(tmp_path, now=NOW)
    assert (info.value.file, info.value.field) == (str(tmp_path / "feb30.py"), "cron")


def test_disabled_job_without_future_point_is_validated_but_allowed(tmp_path: Path) -> None:
    write(tmp_path, {"feb30.py": GOOD.format(args="cron='0 0 30 2 *', enabled=False")})
    jobs = discover_jobs(tmp_path, now=NOW)
    assert len(jobs) == 1 and jobs.active == ()


def test_global_switch_skips_discovery(tmp_path: Path) -> None:
    write(tmp_path, {"broken.py": "raise RuntimeError('must not be imported')\n"})
    settings = PlatformSettings.build(jobs_dir=tmp_path, jobs_enabled=False)
    assert len(discover_from_settings(settings, now=NOW)) == 0


def test_explicit_missing_jobs_dir_is_an_error_default_is_not(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(JobDefinitionError):
        discover_from_settings(PlatformSettings.build(jobs_dir=tmp_path / "nope"), now=NOW)
    monkeypatch.chdir(tmp_path)
    assert len(discover_from_settings(PlatformSettings.build(), now=NOW)) == 0
