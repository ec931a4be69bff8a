"""docker-compose.yml and the Dockerfile refer only to real entry points of the package.

No container engine runs here, so the file is parsed and every command is resolved
against the installed package: the console script and its subcommands, the Celery app
module and the Celery subcommands it is started with.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import click
import yaml

from platform_tasks.cli import main as cli_main
from platform_tasks.cli import run as cli_run

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_expected_services_with_health_checks() -> None:
    assert {"redis", "postgres", "migrate", "worker", "beat-1", "beat-2", "flower"} <= set(SERVICES)
    for name, service in SERVICES.items():
        if name != "migrate":
            assert "healthcheck" in service, f"{name} has no health check"
    beats = [s for s in SERVICES.values() if s.get("command", [])[3:4] == ["beat"]]
    assert len(beats) == 2, "two beat replicas"


def test_platform_tasks_commands_exist() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["platform-tasks"] == "platform_tasks.cli:run"
    entry = importlib.metadata.entry_points(group="console_scripts")["platform-tasks"]
    assert entry.load() is cli_run
    for name, service in SERVICES.items():
        command = service.get("command")
        if command and command[0] == "platform-tasks":
            ctx = click.Context(cli_main)
            resolved = cli_main.get_command(ctx, command[1])
            assert isinstance(resolved, click.Command), f"{name}: unknown {command[1]!r}"


def test_celery_commands_use_the_composition_root() -> None:
    import celery.bin.celery as celery_cli

    known = set(celery_cli.celery.commands) | {"flower"}
    for name, service in SERVICES.items():
        command = service.get("command")
        if not command or command[0] != "celery":
            continue
        assert command[1] == "-A", name
        module_name = command[2]
        assert (ROOT / f"{module_name}.py").exists(), f"{name}: no {module_name}.py"
        assert command[3] in known, f"{name}: celery has no {command[3]!r} command"
        source = (ROOT / f"{module_name}.py").read_text()
        assert "create_app(" in source and "app = " in source
    assert importlib.metadata.version("flower")


def test_environment_names_real_settings() -> None:
    from platform_tasks.settings import PlatformSettings, variable_name

    names = {variable_name(field) for field in PlatformSettings.model_fields}
    env = COMPOSE["x-platform-env"]
    for variable in env:
        assert variable in names, f"{variable} is not a platform setting"


def test_dockerfile_installs_the_package_and_ships_the_app() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install" in text
    for needed in ("platform_tasks", "celery_app.py", "beat_schedules"):
        assert f"COPY {needed}" in text, needed
    assert "USER " in text, "containers do not run as root"
