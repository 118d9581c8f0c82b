"""A doctor job on the server: one uploaded package diagnosed, repaired, proven and measured.

- :class:`DoctorRequest`: what a user asks for (``POST /api/v1/doctor``);
- :class:`DoctorJobView`: the one JSON document of a job (state, progress, the
  :class:`~decodebench.contracts.doctor.DoctorReport`, the repaired model, the A/B sweep);
- the worker's side: :class:`DoctorAssignment` and :class:`DoctorOutcome`; the lease, progress
  and failure reports are every leased kind's (decodebench/contracts/leases.py).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import ConfigDict, Field, StrictInt, field_validator

from decodebench.contracts.api import ComparisonRow
from decodebench.contracts.base import Contract, Incoming
from decodebench.contracts.doctor import DoctorReport
from decodebench.contracts.leases import Lease
from decodebench.contracts.names import SweepState
from decodebench.contracts.profiles import known_device_classes
from decodebench.contracts.uploads import MODEL_NAME, UPLOAD_PREFIX

DEFAULT_TOKENIZER = "smollm2-135m"
MAX_DOCTOR_PROMPTS = 30
MAX_DOCTOR_STEPS = 64
REPAIRED_SUFFIX = ".repaired"


class DoctorState(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


class DoctorRequest(Incoming):
    """Diagnose, repair and prove an uploaded package, then measure it against its repair."""

    package: str = Field(description="An uploaded model of kind mlpackage (its name)")
    tokenizer: str = Field(
        default=DEFAULT_TOKENIZER,
        description="Whose tokenizer encodes the chat prompts: smollm2-135m, or upload:<name> "
        "of an uploaded Hugging Face checkpoint with tokenizer files",
    )
    prompts: StrictInt = Field(
        default=MAX_DOCTOR_PROMPTS, ge=1, le=MAX_DOCTOR_PROMPTS, description="Chat prompts"
    )
    steps: StrictInt = Field(
        default=16, ge=1, le=MAX_DOCTOR_STEPS, description="Greedy tokens per prompt"
    )
    devices: list[str] = Field(
        min_length=1, max_length=8, description="Device classes of the A/B sweep"
    )

    @field_validator("package")
    @classmethod
    def _package_name(cls, value: str) -> str:
        if not MODEL_NAME.match(value):
            raise ValueError("must be 1-48 characters of letters, digits, '.', '_' or '-'")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_source(cls, value: str) -> str:
        if value == DEFAULT_TOKENIZER:
            return value
        if not value.startswith(UPLOAD_PREFIX) or not MODEL_NAME.match(
            value.removeprefix(UPLOAD_PREFIX)
        ):
            raise ValueError(
                f"must be {DEFAULT_TOKENIZER} or upload:<name> of an uploaded checkpoint"
            )
        return value

    @field_validator("devices")
    @classmethod
    def _known_devices(cls, value: list[str]) -> list[str]:
        return known_device_classes(value)


class DoctorJobView(Contract):
    """One doctor job: its request, where it is, and what it found."""

    model_config = ConfigDict(extra="forbid")

    id: int
    state: DoctorState
    package: str
    package_sha256: str = Field(description="The package's content when the job was submitted")
    tokenizer: str
    prompts: int
    steps: int
    devices: list[str]
    progress: float = Field(description="0-1")
    stage: str | None = Field(description="What the worker is doing (or did last)")
    error: str | None
    attempts: int
    submitted_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    report: DoctorReport | None = Field(
        default=None, description="Diagnosis, repairs and proof (when done)"
    )
    repaired_model: str | None = Field(
        default=None, description="The repaired package, registered as an uploaded mlpackage"
    )
    repaired_sha256: str | None = Field(default=None, description="Its zip in the artifact store")
    sweep_id: int | None = Field(default=None, description="The A/B sweep: original, repaired")
    sweep_state: SweepState | None = None
    ab: list[ComparisonRow] = Field(
        default_factory=list,
        description="The A/B sweep's rows per device class and variant, with the repaired "
        "variant's verdict against the original",
    )


class DoctorOverview(Contract):
    model_config = ConfigDict(extra="forbid")

    id: int
    state: DoctorState
    package: str
    devices: list[str]
    progress: float
    stage: str | None
    repaired_model: str | None
    sweep_id: int | None
    created_at: datetime


# The worker's side


class DoctorAssignment(Contract):
    job_id: int
    package: str
    package_sha256: str
    tokenizer: str
    prompts: int
    steps: int
    state: DoctorState


class DoctorOutcome(Lease):
    """The repaired package's zip (already in the artifact store), its KV length (the A/B
    sweep's context) and the report."""

    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    context: StrictInt = Field(ge=1, le=65536)
    report: DoctorReport


class DoctorStateView(Contract):
    state: DoctorState
