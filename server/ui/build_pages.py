"""A build's own page: its analysis drawn and listed, its artifact, and a picker to diff it
against any other build of the same model."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.profiles import DEVICE_PROFILES
from server import tenancy
from server.artifacts.endpoints import StoreDep
from server.auth import SessionDep
from server.builds import service
from server.builds.views import build_detail
from server.errors import NotFound
from server.models import Build, BuildState
from server.paths import QueryRowId, RowId
from server.ui.charts import Bar, StackedBar, bar_chart, stacked_bar_chart
from server.ui.frame import UiUser, render
from server.ui.sweep_charts import BYTE_SERIES, MIB

router = APIRouter(include_in_schema=False)
PICKER_LIMIT = 200


def other_builds(session: Session, build: Build) -> list[Build]:
    """Analysed builds of the same model, newest first: what the diff picker offers."""
    return list(
        session.scalars(
            select(Build)
            .where(
                Build.model == build.model,
                Build.id != build.id,
                Build.state == BuildState.succeeded.value,
                tenancy.builds(session),
            )
            .order_by(Build.id.desc())
            .limit(PICKER_LIMIT)
        )
    )


@router.get("/builds/{build_id}", response_class=HTMLResponse)
def build_page(
    request: Request, build_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    build = service.get_build(session, build_id)
    detail = build_detail(build)
    analysis = detail.report.analysis if detail.report else None
    op_chart = bytes_chart = None
    if analysis is not None:
        ops = sorted(analysis.op_counts.items(), key=lambda item: (-item[1], item[0]))
        op_chart = bar_chart(
            [Bar(label=op, value=count, key=op) for op, count in ops], "Ops by type", "ops"
        )
        moved = analysis.bytes_per_token
        bytes_chart = stacked_bar_chart(
            [
                StackedBar(
                    label=detail.label,
                    parts=[
                        value / MIB
                        for value in (moved.weights, moved.kv_read, moved.kv_write, moved.redundant)
                    ],
                )
            ],
            BYTE_SERIES,
            "Bytes moved per token",
            "MiB",
        )
    return render(
        request,
        "build.html",
        user=user,
        build=detail,
        analysis=analysis,
        op_chart=op_chart,
        bytes_chart=bytes_chart,
        others=[(other.id, _label(other)) for other in other_builds(session, build)],
        device_profiles=DEVICE_PROFILES,
    )


def _label(build: Build) -> str:
    return f"build {build.id} · {VariantSpec.model_validate(build.variant).label}"


@router.get("/builds/{build_id}/diff")
def pick_diff(build_id: RowId, other: QueryRowId, user: UiUser) -> RedirectResponse:
    """The picker is a GET form: it lands on the diff's own address (bookmarkable)."""
    return RedirectResponse(f"/builds/{build_id}/diff/{other}", status_code=303)


@router.get("/builds/{build_id}/download")
def download(build_id: RowId, user: UiUser, session: SessionDep, store: StoreDep) -> FileResponse:
    build = service.get_build(session, build_id)
    if build.artifact_sha256 is None or not store.exists(build.artifact_sha256):
        raise NotFound(f"build {build_id} has no artifact")
    return FileResponse(
        store.open_path(build.artifact_sha256),
        media_type="application/zip",
        filename=f"build-{build_id}.mlpackage.zip",
    )
