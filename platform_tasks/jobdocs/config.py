"""The settings a static run needs, read per profile from ``pyproject.toml`` and the
environment, without building the runtime settings object.

Precedence for a setting ``jobs_X``: environment ``PLATFORM_JOBS_X``, then
``[tool.platform-tasks.profiles.<profile>]``, then ``[tool.platform-tasks]``, then the
runtime default. The docs-only settings ``docs_dir``/``docs_include``/``docs_exclude``
(CLI flag, then profile table, then tool table) override the inherited jobs selection
one by one, and never change what beat schedules. Every value keeps the place it came
from, because the project state has to say why it concluded what it did.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from platform_tasks.errors import ConfigurationError

__all__ = [
    "DocsConfig",
    "DocsConfigError",
    "SelectionOverrides",
    "SettingValue",
    "declared_settings",
    "default_profile",
    "load_docs_config",
]

DEFAULT_PROFILE = "development"
DEFAULT_JOBS_DIR = "beat_schedules"
_TRUE = frozenset({"1", "true", "yes", "on", "t", "y"})
_FALSE = frozenset({"0", "false", "no", "off", "f", "n"})


class DocsConfigError(ConfigurationError):
    """``pyproject.toml`` or a selection setting cannot be read at all."""


class SelectionOverrides(NamedTuple):
    """Docs selection given on the command line; ``None`` means "not given"."""

    dir: Path | None = None
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None


class SettingValue(NamedTuple):
    """A setting's value (``None`` when unset or not statically known) and its origin."""

    value: Any
    source: str
    known: bool = True


class DocsConfig(NamedTuple):
    project_dir: Path
    profile: str
    profile_declared: bool
    jobs_dir: Path
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    source_roots: tuple[Path, ...]
    jobs_enabled: SettingValue
    redis_url: SettingValue


def _read_pyproject(project_dir: Path) -> dict[str, Any]:
    path = project_dir / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DocsConfigError(f"{path}: {exc}") from exc
    tool = data.get("tool", {}).get("platform-tasks", {})
    if not isinstance(tool, dict):
        raise DocsConfigError(f"{path}: [tool.platform-tasks] is not a table")
    return tool


def _globs(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise DocsConfigError(f"{where}: expected a list of globs or a comma-separated string")


class _Layers:
    """Looks a key up in the environment and the profile and tool tables, in that order."""

    def __init__(self, tool: dict[str, Any], profile: str, environ: Mapping[str, str]) -> None:
        profiles = tool.get("profiles", {})
        self.profile_table: dict[str, Any] | None = (
            profiles.get(profile) if isinstance(profiles, dict) else None
        )
        self.tool = tool
        self.profile = profile
        self.environ = environ

    def table(self, key: str) -> SettingValue | None:
        if self.profile_table is not None and key in self.profile_table:
            where = f"{key} in [tool.platform-tasks.profiles.{self.profile}]"
            return SettingValue(self.profile_table[key], where)
        if key in self.tool and key not in ("profiles", "source_roots"):
            return SettingValue(self.tool[key], f"{key} in [tool.platform-tasks]")
        return None

    def setting(self, key: str) -> SettingValue | None:
        variable = f"PLATFORM_{key.upper()}"
        if variable in self.environ:
            return SettingValue(self.environ[variable], f"environment variable {variable}")
        return self.table(key)


def _bool_setting(found: SettingValue | None, declared: bool, profile: str) -> SettingValue:
    if found is None:
        if declared:
            return SettingValue(True, "runtime default (true)")
        return SettingValue(None, f"profile {profile!r} is not declared in pyproject.toml", False)
    value = found.value
    if isinstance(value, bool):
        return found
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return SettingValue(value.strip().lower() in _TRUE, found.source)
    return SettingValue(None, f"{found.source} is not a boolean: {value!r}", False)


def _redis_setting(found: SettingValue | None, declared: bool, profile: str) -> SettingValue:
    if found is not None and isinstance(found.value, str) and found.value.strip():
        return found
    if found is not None:
        return SettingValue(None, f"{found.source} is empty")
    if declared:
        return SettingValue(None, f"no redis_url in [tool.platform-tasks.profiles.{profile}]")
    return SettingValue(None, f"profile {profile!r} is not declared in pyproject.toml", False)


def load_docs_config(
    project_dir: Path,
    profile: str,
    environ: Mapping[str, str],
    overrides: SelectionOverrides | None = None,
) -> DocsConfig:
    """Everything a static run needs for ``profile``; raises :class:`DocsConfigError`
    only when the selection itself cannot be determined."""
    project = project_dir.absolute()
    tool = _read_pyproject(project)
    layers = _Layers(tool, profile, environ)
    overrides = overrides or SelectionOverrides()
    declared = layers.profile_table is not None

    jobs_dir_setting = layers.setting("jobs_dir")
    docs_dir_setting = layers.table("docs_dir")
    if overrides.dir is not None:
        jobs_dir = overrides.dir
    elif docs_dir_setting is not None:
        jobs_dir = Path(str(docs_dir_setting.value))
    elif jobs_dir_setting is not None:
        jobs_dir = Path(str(jobs_dir_setting.value))
    else:
        jobs_dir = Path(DEFAULT_JOBS_DIR)
    jobs_dir = jobs_dir if jobs_dir.is_absolute() else project / jobs_dir

    def globs(kind: str, override: tuple[str, ...] | None) -> tuple[str, ...]:
        if override is not None:
            return override
        for found in (layers.table(f"docs_{kind}"), layers.setting(f"jobs_{kind}")):
            if found is not None:
                return _globs(found.value, found.source)
        return ()

    roots_value = tool.get("source_roots")
    if roots_value is None:
        roots: tuple[Path, ...] = (jobs_dir,)
    elif isinstance(roots_value, list) and all(isinstance(r, str) for r in roots_value):
        roots = tuple(Path(r) if Path(r).is_absolute() else project / r for r in roots_value)
    else:
        raise DocsConfigError("source_roots in [tool.platform-tasks] must be a list of paths")

    return DocsConfig(
        project_dir=project,
        profile=profile,
        profile_declared=declared,
        jobs_dir=jobs_dir,
        include=globs("include", overrides.include),
        exclude=globs("exclude", overrides.exclude),
        source_roots=roots,
        jobs_enabled=_bool_setting(layers.setting("jobs_enabled"), declared, profile),
        redis_url=_redis_setting(layers.setting("redis_url"), declared, profile),
    )


def declared_settings(project_dir: Path, profile: str) -> dict[str, SettingValue]:
    """Every setting ``pyproject.toml`` declares for ``profile``, keyed by its lower-case
    name: ``[tool.platform-tasks.profiles.<profile>]`` over ``[tool.platform-tasks]``, the
    same layers a static run reads. The environment is left to the caller, which lets it
    win as it does here (``platform-tasks jobs list`` builds the runtime settings from this).
    """
    tool = _read_pyproject(project_dir.absolute())
    layers = _Layers(tool, profile, {})
    declared: dict[str, SettingValue] = {}
    for key in (*tool, *(layers.profile_table or {})):
        found = layers.table(key)
        if found is not None:
            declared[key] = found
    return declared


def default_profile(environ: Mapping[str, str]) -> str:
    """``PLATFORM_PROFILE`` when set, else ``development``, as the runtime does."""
    return environ.get("PLATFORM_PROFILE") or DEFAULT_PROFILE
