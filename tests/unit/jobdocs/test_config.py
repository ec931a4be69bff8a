"""Selection and profile settings: env over profile over tool table; docs settings win."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_tasks.jobdocs import DocsConfigError, SelectionOverrides, load_docs_config
from platform_tasks.jobdocs.config import declared_settings, default_profile

PYPROJECT = """
[tool.platform-tasks]
jobs_include = ["*.py"]

[tool.platform-tasks.profiles.development]
jobs_dir = "schedules"
jobs_exclude = "legacy/*, old_*"
redis_url = "redis://dev:6379/0"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_jobs_settings_are_inherited_from_the_profile(tmp_path: Path) -> None:
    config = load_docs_config(_write(tmp_path, PYPROJECT), "development", {})

    assert config.jobs_dir == tmp_path / "schedules"
    assert config.include == ("*.py",)
    assert config.exclude == ("legacy/*", "old_*")
    assert config.source_roots == (tmp_path / "schedules",)
    assert config.redis_url.value == "redis://dev:6379/0"


def test_environment_overrides_pyproject(tmp_path: Path) -> None:
    config = load_docs_config(
        _write(tmp_path, PYPROJECT),
        "development",
        {"PLATFORM_JOBS_DIR": "elsewhere", "PLATFORM_JOBS_EXCLUDE": "a/*,b/*"},
    )

    assert config.jobs_dir == tmp_path / "elsewhere"
    assert config.exclude == ("a/*", "b/*")


def test_docs_settings_override_each_selection_setting_individually(tmp_path: Path) -> None:
    text = PYPROJECT.replace(
        "[tool.platform-tasks]\n", '[tool.platform-tasks]\ndocs_exclude = ["private/*"]\n'
    )
    config = load_docs_config(
        _write(tmp_path, text), "development", {"PLATFORM_JOBS_EXCLUDE": "env/*"}
    )

    assert config.jobs_dir == tmp_path / "schedules"  # still inherited
    assert config.include == ("*.py",)  # still inherited
    assert config.exclude == ("private/*",)  # docs_exclude wins over the environment


def test_cli_overrides_win_over_docs_settings(tmp_path: Path) -> None:
    text = PYPROJECT.replace("[tool.platform-tasks]\n", '[tool.platform-tasks]\ndocs_dir = "d"\n')
    config = load_docs_config(
        _write(tmp_path, text),
        "development",
        {},
        SelectionOverrides(dir=Path("cli"), include=("x/*",)),
    )

    assert config.jobs_dir == tmp_path / "cli"
    assert config.include == ("x/*",)
    assert config.exclude == ("legacy/*", "old_*")


def test_declared_source_roots(tmp_path: Path) -> None:
    text = PYPROJECT.replace(
        "[tool.platform-tasks]\n", '[tool.platform-tasks]\nsource_roots = ["schedules", "lib"]\n'
    )
    config = load_docs_config(_write(tmp_path, text), "development", {})

    assert config.source_roots == (tmp_path / "schedules", tmp_path / "lib")


def test_missing_pyproject_uses_runtime_defaults(tmp_path: Path) -> None:
    config = load_docs_config(tmp_path, "development", {})

    assert config.jobs_dir == tmp_path / "beat_schedules"
    assert not config.profile_declared
    assert not config.jobs_enabled.known


@pytest.mark.parametrize(
    "text",
    [
        "not toml = = =",
        '[tool.platform-tasks]\nsource_roots = "x"\n',
        "[tool.platform-tasks]\njobs_include = [1]\n",
    ],
)
def test_unreadable_configuration_is_an_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(DocsConfigError):
        load_docs_config(_write(tmp_path, text), "development", {})


def test_default_profile() -> None:
    assert default_profile({}) == "development"
    assert default_profile({"PLATFORM_PROFILE": "production"}) == "production"


def test_declared_settings_layer_the_profile_over_the_tool_table(tmp_path: Path) -> None:
    declared = declared_settings(
        _write(tmp_path, PYPROJECT + 'jobs_include = ["a/*"]\n'), "development"
    )

    assert {key: found.value for key, found in declared.items()} == {
        "jobs_include": ["a/*"],
        "jobs_dir": "schedules",
        "jobs_exclude": "legacy/*, old_*",
        "redis_url": "redis://dev:6379/0",
    }
    assert declared["jobs_include"].source == (
        "jobs_include in [tool.platform-tasks.profiles.development]"
    )
    other = declared_settings(tmp_path, "production")
    assert {key: found.value for key, found in other.items()} == {"jobs_include": ["*.py"]}
    assert other["jobs_include"].source == "jobs_include in [tool.platform-tasks]"
