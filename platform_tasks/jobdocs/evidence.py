"""The evidence model: what the static reader may claim about a job, and how sure it is.

Each field carries one of three states that must never collapse into each other: a
reviewer has to tell "the default applies" (*absent*) from "the source says so" (*known*)
from "the source computes it at import time and we did not run it" (*unknown*).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

JsonValue: TypeAlias = str | int | float | bool | None

FIELD_NAMES: tuple[str, ...] = (
    "name",
    "cron",
    "interval",
    "timezone",
    "enabled",
    "lease_ttl",
    "queue",
)
"""The documented fields, in the order every output lists them."""


class FieldState(enum.Enum):
    """How much the source tells about one field of a definition."""

    KNOWN = "known"
    ABSENT = "absent"
    UNKNOWN = "unknown"


class Severity(enum.Enum):
    """Errors fail ``check --static``; warnings only report missing evidence."""

    ERROR = "error"
    WARNING = "warning"


class FieldEvidence(NamedTuple):
    """One field of one definition.

    ``value`` is the literal (known), the documented default (absent, ``None`` when the
    default depends on something not statically known) or ``None`` (unknown). Durations
    are kept as seconds so the value is JSON as it stands.
    """

    state: FieldState
    value: JsonValue = None


class Problem(NamedTuple):
    """Something ``check --static`` reports, tied to a file and, when it applies, a field."""

    severity: Severity
    file: str
    message: str
    field: str | None = None

    def render(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{self.severity.value}: {where}: {self.message}"


@dataclass
class JobEvidence:
    """One ``define_job`` call that was proven to be ours, with its fields and reasons."""

    file: str
    path_label: str
    line: int
    fields: dict[str, FieldEvidence]
    gaps: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every field known or absent, and nothing hid part of the definition."""
        if self.gaps:
            return False
        # A loop, not all(<generator>): asked for every job of every report.
        for evidence in self.fields.values():  # noqa: SIM110
            if evidence.state is FieldState.UNKNOWN:
                return False
        return True

    @property
    def reasons(self) -> list[str]:
        if not self.problems:
            return list(self.gaps)
        return [
            *self.gaps,
            *(p.message if p.field is None else f"{p.field}: {p.message}" for p in self.problems),
        ]


@dataclass
class FileWithoutEvidence:
    """A selected file for which no definition could be established, and why."""

    file: str
    reasons: list[str]


class ProjectStateName(enum.Enum):
    """The conservative one-word summary of what the selected profile would schedule."""

    NO_JOBS = "no_jobs"
    ALL_DISABLED = "all_disabled"
    GLOBALLY_DISABLED = "globally_disabled"
    ACTIVE = "active"
    ACTIVE_WITHOUT_REDIS = "active_without_redis"
    UNKNOWN = "unknown"


class ProjectState(NamedTuple):
    state: ProjectStateName
    reasons: list[str]


@dataclass
class Report:
    """Everything one static run found; ``runtime_verified`` is always false on purpose."""

    profile: str
    project: ProjectState
    jobs: list[JobEvidence]
    files_without_evidence: list[FileWithoutEvidence]
    problems: list[Problem]
    prerendered: tuple[str, list[str]] | None = field(default=None, compare=False, repr=False)
    """``(format, texts)``: each job's entry already written in that format (one per job,
    in order), by the processes that read the files; the matching renderer uses them."""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.WARNING]
