"""Reading a build's stored report (build.json), and naming a build whose report no longer
reads instead of failing every response that shows it."""

from __future__ import annotations

from pydantic import ValidationError

from decodebench.contracts.build import BuildReport
from server.models import Build


class UnreadableReport(ValueError):
    """A build's stored report no longer validates against BuildReport. It was validated when
    the worker completed the build, so only an edit of the database gets here."""


def report_of(build: Build) -> BuildReport | None:
    """The build's build.json through its model (validated when the worker completed it);
    raises UnreadableReport, naming the build, when the stored document no longer validates."""
    if not build.report:
        return None
    try:
        return BuildReport.model_validate(build.report)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise UnreadableReport(
            f"build {build.id}'s stored report is unreadable ({error.error_count()} "
            f"error(s); {where}: {first['msg']})"
        ) from None


def readable_report(build: Build) -> tuple[BuildReport | None, str | None]:
    """The report, or None and why it cannot be read: views show such a build as unreadable
    instead of failing the whole response."""
    try:
        return report_of(build), None
    except UnreadableReport as error:
        return None, str(error)
