"""A doctor job for the server: take the job's lease, fetch the package and the tokenizer, run
:func:`decodebench.doctor.doctor.doctor` (diagnosis, repair, proof) with its progress sent to the
server, upload the repaired package and report. The server then registers the repaired package
as a model and submits the A/B sweep of the two."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from decodebench.artifacts import pack_directory
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.doctor_jobs import DEFAULT_TOKENIZER, DoctorAssignment, DoctorOutcome
from decodebench.contracts.uploads import UPLOAD_PREFIX
from worker.builds import LeaseLost, LeaseRenewal, _delivered
from worker.config import WorkerSettings

log = logging.getLogger(__name__)


class DoctorError(Exception):
    """The job cannot run as asked (its message is the job's error)."""


class DoctorLease(LeaseRenewal):
    what = "doctor job"

    def _report(
        self, client: DecodebenchClient, job_id: int, lease: str, stage: str, fraction: float
    ) -> None:
        client.report_doctor_progress(job_id, lease, stage, fraction)

    def _renewal(self, client: DecodebenchClient, job_id: int, lease: str) -> None:
        client.renew_doctor_lease(job_id, lease)


def run_doctor(job_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log."""
    with DecodebenchClient(settings.server_url, settings.token) as client:
        assignment = client.get_doctor_assignment(job_id)
        start = client.start_doctor(job_id, settings.name)
        if not start.proceed or start.lease is None:
            return f"skipped: doctor job is {start.state}"
        lease = start.lease
        renewal = DoctorLease(settings, job_id, lease, start.lease_seconds or 120.0)
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=settings.work_dir, prefix=f"doctor-{job_id}-") as tmp:
            try:
                outcome = _cure(client, assignment, settings, Path(tmp), renewal, lease)
            except LeaseLost as error:
                renewal.stop()
                log.warning("doctor job %s: stopped, %s", job_id, error)
                return f"refused: {error}"
            except Exception as error:
                log.exception("doctor job %s failed", job_id)
                renewal.stop()
                client.fail_doctor(job_id, lease, _reason(error))
                return f"failed: {error}"
            renewal.stop()
            try:
                _delivered(
                    lambda: client.complete_doctor(job_id, outcome),
                    settings,
                    f"doctor job {job_id} report",
                )
            except ApiError as error:
                if error.status_code == 409:
                    log.warning("doctor job %s: completion refused: %s", job_id, error)
                    return f"refused: {error}"
                if error.status_code == 422:  # e.g. the A/B sweep cannot be made of it
                    client.fail_doctor(job_id, lease, f"completion refused: {error.detail}")
                    return f"failed: {error}"
                raise
            return f"done {outcome.artifact_sha256}"


def _reason(error: Exception) -> str:
    if isinstance(error, DoctorError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _cure(
    client: DecodebenchClient,
    assignment: DoctorAssignment,
    settings: WorkerSettings,
    tmp: Path,
    renewal: LeaseRenewal,
    lease: str,
) -> DoctorOutcome:
    from decodebench.building.package import package_from_zip
    from decodebench.building.sources import fetch_files
    from decodebench.doctor.checkpoint import has_checkpoint
    from decodebench.doctor.doctor import doctor
    from decodebench.formats.coreml.program import MilError, quiet_coremltools

    steps_done = [0]

    def progress(stage: str, fraction: float | None = None) -> None:
        if fraction is None:  # a message from doctor(): creep towards 0.95
            steps_done[0] += 1
            fraction = min(0.95, 0.2 + 0.1 * steps_done[0])
        renewal.progress(stage, fraction)

    progress("fetching the package", 0.02)
    view = client.get_model(assignment.package)
    if view.content_sha256 != assignment.package_sha256:
        raise DoctorError(
            f"package: {assignment.package}'s content is {view.content_sha256}, the job was "
            f"submitted for {assignment.package_sha256}"
        )
    models = settings.work_dir / "models"
    archive = fetch_files(client, view, models) / view.files[0].path
    source = package_from_zip(archive, tmp / "package")
    progress("encoding the chat prompts", 0.08)
    prompts, folder = _prompts(client, assignment, models)
    # An uploaded checkpoint named as the tokenizer is the package's source: its transformers
    # fp32 decodes the prompts too. The default tokenizer's model is not the package's.
    weights = (
        folder if assignment.tokenizer != DEFAULT_TOKENIZER and has_checkpoint(folder) else None
    )
    with quiet_coremltools():
        try:
            vocab, context = _interface(source)
        except MilError as error:
            raise DoctorError(f"package: {error}") from None
        _check_fits(prompts, assignment.steps, vocab, context, assignment.tokenizer)
        out = tmp / "out"
        target = out / f"{assignment.package}.repaired.mlpackage"
        progress("diagnosing", 0.15)
        try:
            report = doctor(
                source, target, prompts, assignment.steps, log=progress, weights=weights
            )
        except MilError as error:
            raise DoctorError(f"doctor: {error}") from None
    progress("uploading the repaired package", 0.97)
    packed = pack_directory(out, tmp / "repaired.zip")
    sha256 = _delivered(
        lambda: client.upload_artifact(packed), settings, f"doctor job {assignment.job_id} package"
    )
    return DoctorOutcome(lease=lease, artifact_sha256=sha256, context=context, report=report)


def _prompts(
    client: DecodebenchClient, assignment: DoctorAssignment, models: Path
) -> tuple[list[list[int]], Path]:
    """The chat prompts' token ids, and the folder whose tokenizer encoded them."""
    from decodebench.building.sources import fetch_files
    from decodebench.prompts import chat_prompts, chat_token_ids, has_tokenizer

    if assignment.tokenizer == DEFAULT_TOKENIZER:
        from decodebench.building.realmodels import fetch_model

        folder = fetch_model(DEFAULT_TOKENIZER)
    else:
        checkpoint = client.get_model(assignment.tokenizer.removeprefix(UPLOAD_PREFIX))
        folder = fetch_files(client, checkpoint, models)
    if not has_tokenizer(folder):
        raise DoctorError(f"tokenizer: {assignment.tokenizer} holds no tokenizer")
    texts = [prompt.text for prompt in chat_prompts(assignment.prompts)]
    return chat_token_ids(folder, texts), folder


def _interface(package: Path) -> tuple[int, int]:
    """The package's vocabulary and context, read from its decode interface."""
    from decodebench.formats.coreml.cache_io import decode_session
    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.program import load_package

    session = decode_session(Interpreter(load_package(package).program), package.name)
    return session.interface.vocab, session.interface.context


def _check_fits(
    prompts: list[list[int]], steps: int, vocab: int, context: int, tokenizer: str
) -> None:
    """A tokenizer whose ids the package has no logits for, or prompts longer than its context,
    are refused before hours of decoding, naming what does not fit."""
    highest = max(max(prompt) for prompt in prompts)
    if highest >= vocab:
        raise DoctorError(
            f"tokenizer: {tokenizer} encodes the prompts with token ids up to {highest}, but the "
            f"package's vocabulary has {vocab} tokens; choose the package's own tokenizer "
            "(tokenizer: upload:<checkpoint>)"
        )
    longest = max(len(prompt) for prompt in prompts)
    if longest + steps > context:
        raise DoctorError(
            f"steps: a prompt of {longest} tokens and {steps} steps need {longest + steps} "
            f"positions; the package's context is {context}"
        )
