"""A doctor job for the server, the leased-work loop (worker/leased.py) with the doctor's
handler: fetch the package and the tokenizer, run
:func:`decodebench.doctor.doctor.doctor` (diagnosis, repair, proof) with its progress sent to the
server, upload the repaired package and report. The server then registers the repaired package
as a model and submits the A/B sweep of the two."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from decodebench.artifacts import pack_directory
from decodebench.client import DecodebenchClient, LeasedWork
from decodebench.contracts.doctor_jobs import DEFAULT_TOKENIZER, DoctorAssignment, DoctorOutcome
from decodebench.contracts.uploads import UPLOAD_PREFIX
from worker.config import WorkerSettings
from worker.leased import Held, LeasedKind, WorkError, delivered, run_leased


class DoctorError(WorkError):
    """The job cannot run as asked (its message is the job's error)."""


def _doctor_jobs(client: DecodebenchClient) -> LeasedWork[DoctorAssignment]:
    return client.doctor_jobs


def _handle(held: Held[DoctorAssignment]) -> tuple[DoctorOutcome, str]:
    outcome = _cure(
        held.client, held.assignment, held.settings, held.tmp, held.progress, held.lease
    )
    return outcome, f"done {outcome.artifact_sha256}"


# A completion the server refuses as invalid (the A/B sweep cannot be made of it) fails the job.
DOCTOR_JOBS = LeasedKind(
    noun="doctor job", calls=_doctor_jobs, handle=_handle, fail_refused_completion=True
)


def run_doctor(job_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log."""
    return run_leased(DOCTOR_JOBS, job_id, settings)


def _cure(
    client: DecodebenchClient,
    assignment: DoctorAssignment,
    settings: WorkerSettings,
    tmp: Path,
    report_progress: Callable[[str, float], None],
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
        report_progress(stage, fraction)

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
    sha256 = delivered(
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
