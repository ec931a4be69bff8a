"""Reading one selected job file into job evidence, or into a reason why there is none.

A file is handled on its own: a syntax error, a wrapper or a cycle in one file costs
that file's evidence, never the rest of the report.
"""

from __future__ import annotations

import ast

from platform_tasks.jobdocs.definitions import find_definition_calls
from platform_tasks.jobdocs.evidence import (
    FieldEvidence,
    FileWithoutEvidence,
    JobEvidence,
    Problem,
    Severity,
)
from platform_tasks.jobdocs.fields import read_call_fields
from platform_tasks.jobdocs.resolve import DEFINE_JOB, Resolver
from platform_tasks.jobdocs.symbols import standalone_relative_import
from platform_tasks.jobdocs.validation import PendingCron, cron_problem, validate_fields

__all__ = ["FileAnalysis", "analyse_file"]


class FileAnalysis:
    """What one job file gave. A plain class: one is made (and pickled, in a child) per
    file, and a dataclass costs a millisecond to define at every start-up."""

    __slots__ = ("jobs", "pending_crons", "problems", "texts", "without_evidence")

    def __init__(self) -> None:
        self.jobs: list[JobEvidence] = []
        self.without_evidence: FileWithoutEvidence | None = None
        self.problems: list[Problem] = []
        self.pending_crons: list[tuple[int, int, PendingCron]] = []
        """Deferred cron checks: (index in ``jobs``, index in that job's problems, check)."""
        self.texts: list[str] | None = None
        """The jobs already rendered (see ``Report.prerendered``), when asked for."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Children send every analysis back pickled: plain tuples cost a third less to
        # write and read than the default protocol for slots and dataclass instances.
        jobs = [(j.file, j.path_label, j.line, j.fields, j.gaps, j.problems) for j in self.jobs]
        state = (jobs, self.without_evidence, self.problems, self.pending_crons, self.texts)
        return (_rebuild_analysis, state)

    def settle_crons(self) -> list[int]:
        """Run the deferred cron checks, putting each violation where
        :func:`validate_fields` would have (one per job, so the indexes stay valid).
        Returns the indexes of the jobs that gained a problem."""
        changed: list[int] = []
        for job_index, slot, pending in self.pending_crons:
            message = cron_problem(pending)
            if message:
                job = self.jobs[job_index]
                job.problems.insert(slot, _error(job.file, message, "cron"))
                changed.append(job_index)
        self.pending_crons.clear()
        return changed


def _rebuild_analysis(
    jobs: list[tuple[str, str, int, dict[str, FieldEvidence], list[str], list[Problem]]],
    without_evidence: FileWithoutEvidence | None,
    problems: list[Problem],
    pending_crons: list[tuple[int, int, PendingCron]],
    texts: list[str] | None,
) -> FileAnalysis:
    analysis = FileAnalysis.__new__(FileAnalysis)
    analysis.jobs = [JobEvidence(*job) for job in jobs]
    analysis.without_evidence = without_evidence
    analysis.problems = problems
    analysis.pending_crons = pending_crons
    analysis.texts = texts
    return analysis


def _error(file: str, message: str, field_name: str | None = None) -> Problem:
    return Problem(Severity.ERROR, file, message, field_name)


def _failing_imports(tree: ast.Module) -> list[str]:
    """Relative imports that run unconditionally when discovery imports the job file.

    Discovery imports a job file under a generated module name that belongs to no
    package, so each of these raises at start-up: an error, like a syntax error.
    """
    return [
        standalone_relative_import(stmt.lineno)
        for stmt in tree.body
        if stmt.__class__ is ast.ImportFrom and stmt.level
    ]


def analyse_file(
    resolver: Resolver, path: str, label: str, *, defer_cron: bool = False
) -> FileAnalysis:
    """Evidence for the selected job file at ``path`` (absolute); never imports it. With
    ``defer_cron`` the cron checks wait for :meth:`FileAnalysis.settle_crons`."""
    index = resolver.index
    file = index.relative(path)
    result = FileAnalysis()
    module = index.parse(path, standalone=True)
    if module.tree is None:
        reason = module.syntax_error or "cannot be parsed"
        result.without_evidence = FileWithoutEvidence(file, [reason])
        result.problems.append(_error(file, reason))
        return result

    failing = [_error(file, reason) for reason in _failing_imports(module.tree)]
    result.problems.extend(failing)
    found = find_definition_calls(resolver, module)
    if not found.definitions:
        if found.wrappers or found.hidden or failing:
            gaps = [*found.wrappers, *found.hidden]
            reasons = [*(problem.message for problem in failing), *gaps]
            result.without_evidence = FileWithoutEvidence(file, reasons)
            result.problems.extend(Problem(Severity.WARNING, file, r) for r in gaps)
        else:
            reason = f"no call to {DEFINE_JOB}; every selected file must define exactly one job"
            result.without_evidence = FileWithoutEvidence(file, [reason])
            result.problems.append(_error(file, reason))
        return result

    several: Problem | None = None
    if len(found.definitions) > 1:
        lines = ", ".join(str(call.lineno) for call in found.definitions)
        count = len(found.definitions)
        several = _error(file, f"{count} definitions (lines {lines}); exactly one allowed")
    for call in found.definitions:
        fields = read_call_fields(resolver, module, call, label)
        job = JobEvidence(
            file=file,
            path_label=label,
            line=call.lineno,
            fields=fields.evidence,
            gaps=[*found.wrappers, *fields.gaps],
        )
        job.problems.extend(failing)
        if several is not None:
            job.problems.append(several)
        if fields.call_errors:
            job.problems.extend(_error(file, message) for message in fields.call_errors)
        for name, message in validate_fields(fields.evidence, fields.known, defer_cron=True):
            if isinstance(message, PendingCron):
                slot = (len(result.jobs), len(job.problems), message)
                result.pending_crons.append(slot)
            else:
                job.problems.append(_error(file, message, name))
        result.jobs.append(job)
    if not defer_cron:
        result.settle_crons()
    return result
