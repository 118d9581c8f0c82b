"""What a request may see: the one place tenancy is decided.

A user token belongs to one project. Authentication binds the request's database session to it
(:func:`bind`), and every service narrows its queries with the filters below, so a row of
another project is simply not found: 404, never 403, and nothing about it is revealed.

- sweeps, schedules and manual calibrations carry their project;
- runs and prompt results belong to their sweep's project, firings and alerts to their
  schedule's;
- a build is content-addressed and shared: it is visible to a project when one of that
  project's sweeps references it, and so is its artifact (by hash);
- a doctor job carries its project, and so does the repaired package it made (its artifact is
  visible to that project by hash);
- a device is shared unless an operator pinned it to a project: then only that project sees
  it, and it claims only that project's runs.

Agent and worker tokens are not project-scoped: their sessions are unbound and see every row
(as do beat's ticks and the operator's commands).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, exists, false, select, true
from sqlalchemy.orm import Session

from server.errors import Forbidden
from server.models import (
    Alert,
    ApiToken,
    Build,
    Device,
    DoctorJob,
    ProfileCalibration,
    Project,
    Run,
    Schedule,
    Sweep,
    SweepVariant,
    TokenKind,
    Upload,
    UserModel,
)

_PROJECT_KEY = "tenancy.project_id"
_BOUND_KEY = "tenancy.bound"


def bind(session: Session, token: ApiToken) -> None:
    """Scope this session to the token's project (user tokens); other roles see every project.
    A user token without a project sees nothing (fail closed)."""
    if token.kind != TokenKind.user.value:
        return
    session.info[_BOUND_KEY] = True
    session.info[_PROJECT_KEY] = token.project_id


def project_id(session: Session) -> int | None:
    """The bound project's id, or None for a session that serves every project."""
    return session.info.get(_PROJECT_KEY)


def _bound(session: Session) -> bool:
    return bool(session.info.get(_BOUND_KEY))


def _owned(session: Session, column: ColumnElement[int] | object) -> ColumnElement[bool]:
    if not _bound(session):
        return true()
    project = project_id(session)
    if project is None:
        return false()
    return column == project  # type: ignore[return-value]


def sweeps(session: Session) -> ColumnElement[bool]:
    return _owned(session, Sweep.project_id)


def runs(session: Session) -> ColumnElement[bool]:
    if not _bound(session):
        return true()
    return Run.sweep_id.in_(select(Sweep.id).where(sweeps(session)))


def builds(session: Session) -> ColumnElement[bool]:
    """A build is visible when one of the project's sweeps references it."""
    if not _bound(session):
        return true()
    return exists(
        select(SweepVariant.id)
        .join(Sweep, Sweep.id == SweepVariant.sweep_id)
        .where(SweepVariant.build_id == Build.id, sweeps(session))
    )


def artifact_visible(session: Session, sha256: str) -> bool:
    """An artifact is visible when a visible build produced it, or when the project uploaded it
    (a file of a model it brought)."""
    if not _bound(session):
        return True
    produced = exists().where(Build.artifact_sha256 == sha256, builds(session))
    uploaded = exists().where(Upload.sha256 == sha256, Upload.state == "finished", uploads(session))
    repaired = exists().where(DoctorJob.artifact_sha256 == sha256, doctor_jobs(session))
    return bool(session.scalar(select(produced | uploaded | repaired)))


def uploads(session: Session) -> ColumnElement[bool]:
    return _owned(session, Upload.project_id)


def models(session: Session) -> ColumnElement[bool]:
    """The models the project brought (names are unique across the server, contents are not
    shown to another project)."""
    return _owned(session, UserModel.project_id)


def doctor_jobs(session: Session) -> ColumnElement[bool]:
    return _owned(session, DoctorJob.project_id)


def schedules(session: Session) -> ColumnElement[bool]:
    return _owned(session, Schedule.project_id)


def alerts(session: Session) -> ColumnElement[bool]:
    if not _bound(session):
        return true()
    return Alert.schedule_id.in_(select(Schedule.id).where(schedules(session)))


def calibrations(session: Session) -> ColumnElement[bool]:
    return _owned(session, ProfileCalibration.project_id)


def devices(session: Session, project: int | None = None) -> ColumnElement[bool]:
    """Shared devices and the ones pinned to the project (the bound one, or ``project``)."""
    if project is not None:
        return Device.project_id.is_(None) | (Device.project_id == project)
    if not _bound(session):
        return true()
    return Device.project_id.is_(None) | _owned(session, Device.project_id)


def claimable(
    sweep_project: ColumnElement[int | None], device_project: ColumnElement[int | None]
) -> ColumnElement[bool]:
    """Whether a device (pinned to ``device_project``, or shared when it is NULL) may claim the
    runs of a sweep of ``sweep_project``: a shared device any project's, a pinned one only its
    own project's. The queue's ranking (server/runs/queue.py) is built from this clause."""
    return device_project.is_(None) | (sweep_project == device_project)


def owner(session: Session) -> int:
    """The project that owns what this session creates."""
    project = project_id(session)
    if project is None and _bound(session):
        raise Forbidden("this user token belongs to no project (create-token --project NAME)")
    if project is None:
        raise LookupError("this session is not bound to a project")
    return project


def project_named(session: Session, name: str, *, create: bool = False) -> Project:
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        if not create:
            raise LookupError(f"no project named {name!r}")
        project = Project(name=name)
        session.add(project)
        session.flush()
    return project
