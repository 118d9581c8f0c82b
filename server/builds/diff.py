"""The graph diff of two builds, from the analyses their workers uploaded."""

from __future__ import annotations

from sqlalchemy.orm import Session

from decodebench.analysis.diff import GraphDiff, diff_analyses
from decodebench.contracts.analysis import GraphAnalysis
from server.build_reports import UnreadableReport, report_of
from server.builds.service import get_build
from server.builds.views import build_label
from server.errors import Conflict
from server.models import Build
from server.profiles.service import current_profiles


def stored_analysis(build: Build) -> GraphAnalysis:
    try:
        report = report_of(build)
    except UnreadableReport as error:
        raise Conflict(str(error)) from None
    if report is None:
        raise Conflict(f"build {build.id} has no analysis yet (it is {build.state})")
    return report.analysis


def diff_builds(session: Session, a_id: int, b_id: int) -> GraphDiff:
    """B against A: ``speedup > 1`` means B should decode faster (current profiles)."""
    a, b = get_build(session, a_id), get_build(session, b_id)
    return diff_analyses(
        stored_analysis(a),
        stored_analysis(b),
        labels=(build_label(a), build_label(b)),
        profiles=current_profiles(session).values(),
    )
