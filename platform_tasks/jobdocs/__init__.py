"""Static job documentation: what ``beat_schedules/`` declares, read without importing it.

Reviewers and CI need the list of scheduled jobs without running business modules
(imports have side effects, need secrets, open connections). Everything here works on
``ast`` trees and file contents only; see ``docs/jobs-docs.md`` for the evidence rules.
"""

from __future__ import annotations

from platform_tasks.jobdocs.config import (
    DocsConfig,
    DocsConfigError,
    SelectionOverrides,
    declared_settings,
    default_profile,
    load_docs_config,
)
from platform_tasks.jobdocs.evidence import (
    FieldEvidence,
    FieldState,
    FileWithoutEvidence,
    JobEvidence,
    Problem,
    ProjectState,
    ProjectStateName,
    Report,
    Severity,
)
from platform_tasks.jobdocs.render_json import render_json, report_to_dict
from platform_tasks.jobdocs.render_markdown import render_markdown
from platform_tasks.jobdocs.report import build_report

__all__ = [
    "DocsConfig",
    "DocsConfigError",
    "FieldEvidence",
    "FieldState",
    "FileWithoutEvidence",
    "JobEvidence",
    "Problem",
    "ProjectState",
    "ProjectStateName",
    "Report",
    "SelectionOverrides",
    "Severity",
    "build_report",
    "declared_settings",
    "default_profile",
    "load_docs_config",
    "render_json",
    "render_markdown",
    "report_to_dict",
]
