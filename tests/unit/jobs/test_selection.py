"""The job file selection rule shared by beat, workers and the static docs reader."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_tasks.jobs.selection import (
    is_ignored_name,
    path_label,
    select_job_files,
    select_job_paths,
)


def _touch(root: Path, *relatives: str) -> None:
    for relative in relatives:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def _relatives(root: Path, files: list[Path]) -> list[str]:
    return [file.relative_to(root).as_posix() for file in files]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _touch(
        tmp_path,
        "nightly.py",
        "billing/nightly.py",
        "billing/weekly.py",
        "_common.py",
        "billing/_helpers.py",
        "_private/job.py",
        "_private/_deep/other.py",
        "test_nightly.py",
        "nightly_test.py",
        "conftest.py",
        "stubs.pyi",
        "notes.txt",
        "__pycache__/nightly.py",
        ".hidden/job.py",
        "billing/.cache/job.py",
        ".dotfile.py",
    )
    return tmp_path


def test_default_selection_takes_py_files_and_descends_into_underscore_dirs(tree: Path) -> None:
    files = select_job_files(tree)

    assert _relatives(tree, files) == [
        "_private/_deep/other.py",
        "_private/job.py",
        "billing/nightly.py",
        "billing/weekly.py",
        "nightly.py",
    ]


def test_selected_paths_are_absolute_even_for_a_relative_root(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree.parent)

    files = select_job_files(Path(tree.name))

    assert files
    assert all(file.is_absolute() for file in files)
    assert files == select_job_files(tree)


def test_include_replaces_the_default_selection(tree: Path) -> None:
    files = select_job_files(tree, include=["billing/*"])

    assert _relatives(tree, files) == ["billing/nightly.py", "billing/weekly.py"]


def test_include_cannot_select_built_in_ignores(tree: Path) -> None:
    files = select_job_files(tree, include=["*"])

    assert "_common.py" not in _relatives(tree, files)
    assert "test_nightly.py" not in _relatives(tree, files)
    assert "stubs.pyi" not in _relatives(tree, files)
    assert "notes.txt" not in _relatives(tree, files)
    assert _relatives(tree, files) == _relatives(tree, select_job_files(tree))


def test_exclude_adds_to_the_built_in_ignores(tree: Path) -> None:
    files = select_job_files(tree, exclude=["billing/*", "*/_deep/*"])

    assert _relatives(tree, files) == ["_private/job.py", "nightly.py"]


def test_include_and_exclude_combine(tree: Path) -> None:
    files = select_job_files(tree, include=["*nightly.py"], exclude=["billing/*"])

    assert _relatives(tree, files) == ["nightly.py"]


def test_globs_are_case_sensitive(tree: Path) -> None:
    assert select_job_files(tree, include=["BILLING/*"]) == []


def test_missing_root_selects_nothing(tmp_path: Path) -> None:
    assert select_job_files(tmp_path / "absent") == []


@pytest.mark.parametrize(
    ("name", "ignored"),
    [
        ("job.py", False),
        ("_common.py", True),
        ("__init__.py", True),
        ("test_job.py", True),
        ("job_test.py", True),
        ("conftest.py", True),
        ("job.pyi", True),
        ("job.txt", True),
        ("testing.py", False),
        ("contest.py", False),
    ],
)
def test_built_in_ignores(name: str, ignored: bool) -> None:
    assert is_ignored_name(name) is ignored


@pytest.mark.parametrize(
    ("relative", "label"),
    [
        ("nightly.py", "nightly"),
        ("billing/nightly.py", "billing.nightly"),
        ("_private/job.py", "_private.job"),
        ("a/b/c.py", "a.b.c"),
    ],
)
def test_path_label(tmp_path: Path, relative: str, label: str) -> None:
    assert path_label(tmp_path, tmp_path / relative) == label


def test_path_label_refuses_a_file_outside_the_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        path_label(tmp_path / "jobs", tmp_path / "other" / "x.py")


def test_order_is_path_order_not_string_order(tmp_path: Path) -> None:
    # "a-c.py" sorts before "a/b.py" as a string ('-' < '/'), after it as a path.
    for relative in ("a/b.py", "a-c.py", "a_b/z.py", "B.py", "a/a/x.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    selected = select_job_files(tmp_path)
    assert selected == sorted(selected)
    assert [p.relative_to(tmp_path).as_posix() for p in selected] == [
        "B.py",
        "a/a/x.py",
        "a/b.py",
        "a-c.py",
        "a_b/z.py",
    ]


_NAME = st.text(alphabet="ab_.-1A", min_size=1, max_size=4)
_DIRECTORY = _NAME.filter(lambda name: not name.startswith("."))
"""What a walk can report below the root: hidden directories (and ``.``) are pruned."""
_GLOB = st.lists(
    st.sampled_from(["*", "?", "a", "_", ".py", "/", "[ab]", "[!a]", "1", "A"]),
    min_size=1,
    max_size=5,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    paths=st.lists(
        st.lists(_DIRECTORY, min_size=0, max_size=3).map(lambda parts: "/".join([*parts, ""])),
        max_size=12,
    ).flatmap(lambda dirs: st.lists(st.tuples(st.sampled_from(dirs or [""]), _NAME), max_size=20)),
    include=st.lists(_GLOB, max_size=3),
    exclude=st.lists(_GLOB, max_size=3),
)
def test_selection_equals_the_reference_rule(
    paths: list[tuple[str, str]], include: list[str], exclude: list[str]
) -> None:
    """Compiled globs and string sorting pick and order exactly what fnmatchcase per glob
    and sorting by path components would."""
    root = Path(__file__).parent
    candidates = sorted({directory + name + ".py" for directory, name in paths})
    wanted = include or ["*.py"]
    expected = sorted(
        (
            relative
            for relative in candidates
            if not is_ignored_name(relative.rpartition("/")[2])
            and any(fnmatchcase(relative, glob) for glob in wanted)
            and not any(fnmatchcase(relative, glob) for glob in exclude)
        ),
        key=lambda relative: relative.split("/"),
    )

    selected = select_job_paths(root, include, exclude, candidates=reversed(candidates))

    assert selected == [str(root.absolute() / relative) for relative in expected]
