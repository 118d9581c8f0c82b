"""Doctor jobs: submitted by a user, run by a build worker under a lease, completed by
registering the repaired package as a model and submitting the A/B sweep of the two."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from decodebench.contracts.doctor_jobs import (
    DEFAULT_TOKENIZER,
    REPAIRED_SUFFIX,
    DoctorOutcome,
    DoctorRequest,
    DoctorState,
    DoctorStateView,
)
from decodebench.contracts.domain import SweepSpec, VariantSpec
from decodebench.contracts.names import FormatName
from decodebench.contracts.uploads import UPLOAD_PREFIX, ModelKind
from decodebench.modelfiles import ModelFileError, check_package_zip, content_sha256
from server import leases, tenancy
from server.artifacts.store import ArtifactStore
from server.config import Settings
from server.errors import InvalidInput, NotFound
from server.models import DoctorJob, UserModel
from server.sweeps.service import submit_sweep
from server.tasks import enqueue_doctor
from server.transitions import move, record_created
from server.usermodels.service import named_model, visible_model

ENTITY = "doctor"
ORIGINAL, REPAIRED = "original", "repaired"
# A tokenizer a folder must hold one of to encode the chat prompts.
TOKENIZER_MODELS = frozenset({"tokenizer.json", "tokenizer.model", "vocab.json"})


def get_job(
    session: Session, job_id: int, *, lock: bool = False, report: bool = False
) -> DoctorJob:
    statement = select(DoctorJob).where(DoctorJob.id == job_id, tenancy.doctor_jobs(session))
    if report:
        statement = statement.options(undefer(DoctorJob.report))
    if lock:
        statement = statement.with_for_update()
    job = session.scalar(statement)
    if job is None:
        raise NotFound(f"no doctor job {job_id}")
    return job


def list_jobs(session: Session, limit: int = 100) -> list[DoctorJob]:
    return list(
        session.scalars(
            select(DoctorJob)
            .where(tenancy.doctor_jobs(session))
            .order_by(DoctorJob.id.desc())
            .limit(limit)
        )
    )


def check_request(session: Session, request: DoctorRequest) -> UserModel:
    """The package the request names; 422 naming the field for an unknown or unfit model."""
    package = visible_model(session, request.package)
    if package is None:
        raise InvalidInput(
            f"package: no uploaded model {request.package!r} (POST /api/v1/models first)"
        )
    if package.kind != ModelKind.package:
        raise InvalidInput(
            f"package: {request.package!r} is a {package.kind} checkpoint, not a .mlpackage"
        )
    if package.format != FormatName.coreml:
        raise InvalidInput(
            f"package: {request.package!r} is a {package.format} package; the doctor examines "
            "Core ML packages (coreml)"
        )
    if request.tokenizer != DEFAULT_TOKENIZER:
        name = request.tokenizer.removeprefix(UPLOAD_PREFIX)
        checkpoint = visible_model(session, name)
        if checkpoint is None:
            raise InvalidInput(f"tokenizer: no uploaded model {name!r}")
        if checkpoint.kind != ModelKind.hf:
            raise InvalidInput(
                f"tokenizer: {name!r} is a {checkpoint.kind}; a tokenizer comes from a "
                "Hugging Face checkpoint"
            )
        paths = {entry["path"] for entry in checkpoint.files}
        if not paths & TOKENIZER_MODELS:
            raise InvalidInput(
                f"tokenizer: {name!r} holds no tokenizer files "
                f"({', '.join(sorted(TOKENIZER_MODELS))})"
            )
    return package


def submit_job(session: Session, request: DoctorRequest, by: str) -> DoctorJob:
    package = check_request(session, request)  # 422 before anything is written
    job = DoctorJob(
        project_id=tenancy.owner(session),
        submitted_by=by,
        package=package.name,
        package_sha256=package.content_sha256,
        tokenizer=request.tokenizer,
        prompts=request.prompts,
        steps=request.steps,
        devices=list(request.devices),
        state=DoctorState.queued,
        progress=0.0,
        attempts=0,
    )
    session.add(job)
    session.flush()
    record_created(session, ENTITY, job.id, DoctorState.queued, f"submitted by {by}")
    enqueue_doctor(session, job.id)
    return job


def repaired_model_name_of(session: Session, job: DoctorJob) -> str:
    model = session.get(UserModel, job.repaired_model_id) if job.repaired_model_id else None
    return model.name if model is not None else f"{job.package}{REPAIRED_SUFFIX}"


def repaired_name(session: Session, job: DoctorJob, content: str) -> str:
    """``<package>.repaired``, or, when that name is taken by other files (or too long), a name
    with the job's id."""
    preferred = f"{job.package}{REPAIRED_SUFFIX}"
    if len(preferred) <= 48:
        existing = named_model(session, preferred)
        if existing is None or (
            existing.content_sha256 == content and existing.project_id == job.project_id
        ):
            return preferred
    return f"doctor-{job.id}{REPAIRED_SUFFIX}"


def complete_job(
    session: Session,
    job_id: int,
    outcome: DoctorOutcome,
    store: ArtifactStore,
    settings: Settings,
) -> DoctorJob:
    """The worker's report: stored, the repaired package registered as a model and the A/B
    sweep submitted, in one transaction. A second completion (its answer lost, or from a worker
    whose lease ran out) is 409 and changes nothing."""
    job = leases.held(session, DOCTOR_JOBS, job_id, outcome.lease)
    if not store.exists(outcome.artifact_sha256):
        raise InvalidInput(f"artifact {outcome.artifact_sha256} has not been uploaded")
    model = _register_repaired(session, job, outcome.artifact_sha256, store, settings)
    spec = SweepSpec(
        model=job.tokenizer,
        variants=[
            VariantSpec(
                name=ORIGINAL, package=job.package, context=outcome.context, allow_non_finite=True
            ),
            VariantSpec(name=REPAIRED, package=model.name, context=outcome.context),
        ],
        devices=list(job.devices),
        prompts=job.prompts,
        decode_tokens=min(job.steps, outcome.context - 1),
        baseline=ORIGINAL,
    )
    try:
        sweep = submit_sweep(
            session, spec, job.submitted_by, settings.toolchain, project_id=job.project_id
        )
    except InvalidInput as error:
        raise InvalidInput(f"the A/B sweep: {error.message}") from None
    now = datetime.now(UTC)
    job.report = outcome.report.model_dump(mode="json")
    job.artifact_sha256 = outcome.artifact_sha256
    job.repaired_model_id = model.id
    job.sweep_id = sweep.id
    job.stage = "done"
    job.progress = 1.0
    job.finished_at = now
    leases.release(job, now)
    applied = outcome.report.repair.applied
    move(
        session,
        ENTITY,
        job,
        DoctorState.done,
        f"repaired ({', '.join(applied) or 'nothing applied'}) as {model.name}; A/B sweep {sweep.id}",
    )
    return job


def _register_repaired(
    session: Session, job: DoctorJob, sha256: str, store: ArtifactStore, settings: Settings
) -> UserModel:
    file_name = f"{job.package}{REPAIRED_SUFFIX}.mlpackage.zip"[-128:]
    content = content_sha256([(file_name, sha256)])
    name = repaired_name(session, job, content)
    existing = named_model(session, name)
    if existing is not None:
        return existing
    path = store.path_for(sha256)
    try:
        summary = check_package_zip(path, file_name, settings.max_model_bytes)
    except ModelFileError as error:
        raise InvalidInput(f"artifact_sha256: {error}") from None
    size = path.stat().st_size
    model = UserModel(
        name=name,
        kind=ModelKind.package.value,
        format=FormatName.coreml.value,
        architecture=None,
        content_sha256=content,
        total_bytes=size,
        files=[{"path": file_name, "sha256": sha256, "bytes": size}],
        summary={**summary, "repaired_from": job.package, "doctor_job": job.id},
        created_by=job.submitted_by,
        project_id=job.project_id,
    )
    session.add(model)
    session.flush()
    return model


def _fail(session: Session, job: DoctorJob, reason: str) -> DoctorJob:
    job.error = reason
    job.finished_at = datetime.now(UTC)
    leases.release(job, job.finished_at)
    move(session, ENTITY, job, DoctorState.failed, reason)
    return job


def _get_locked(session: Session, job_id: int, lock: bool) -> DoctorJob:
    return get_job(session, job_id, lock=lock)


def _clear_error(job: DoctorJob) -> None:
    job.error = None


# Doctor jobs as leased work (server/leases.py), with settings of their own.
DOCTOR_JOBS = leases.LeasedKind(
    entity=ENTITY,
    noun="doctor job",
    model=DoctorJob,
    queued=DoctorState.queued,
    running=DoctorState.running,
    finished=(DoctorState.done, DoctorState.failed),
    attempts_setting="max_doctor_attempts",
    lease_setting="doctor_lease_seconds",
    get=_get_locked,
    fail=_fail,
    enqueue=enqueue_doctor,
    state_view=DoctorStateView,
    on_start=_clear_error,
)
