"""The documentation site builds with ``mkdocs build --strict``, and strict means strict.

``mkdocs.yml`` lists every page of ``docs/`` in ``nav`` and raises the checks MkDocs only
reports by default (a page left out of ``nav``, a link to a missing anchor) to warnings,
which ``strict: true`` turns into a failed build. The first test builds the real site; the
others build a copy with one fault planted, to show the build really fails on it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``; its log in ``stdout``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )


def copy_of_the_site(tmp_path: Path) -> Path:
    """The site's configuration and pages copied under ``tmp_path``; the config's path."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path / "mkdocs.yml"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout
    assert (tmp_path / "site" / "index.html").is_file()


def test_a_page_left_out_of_nav_a_broken_link_or_a_missing_anchor_fails_the_build(
    tmp_path: Path,
) -> None:
    """One build of a copy with three faults planted: each is reported as a warning, and a
    warning fails a strict build (MkDocs reports all of them before it aborts)."""
    config = copy_of_the_site(tmp_path)
    (tmp_path / "docs" / "orphan.md").write_text("# A page nobody can reach\n")
    with (tmp_path / "docs" / "cli.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
        page.write("\nSee [a section that is not there](limits.md#no-such-section).\n")
    result = build(config, tmp_path / "site")
    assert result.returncode != 0, result.stdout
    warnings = "\n".join(
        line for line in result.stdout.splitlines(keepends=False) if not line.startswith("INFO")
    )
    assert 'not included in the "nav" configuration:\n  - orphan.md' in warnings, warnings
    assert "'no-such-page.md', but the target is not found" in warnings, warnings
    assert "does not contain an anchor '#no-such-section'" in warnings, warnings
    assert "Aborted with 3 warnings in strict mode!" in warnings, warnings
