"""Doctor jobs: an uploaded package diagnosed, repaired, proven and measured against its repair."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import DateTime, Float, Integer, String, Text

from decodebench.contracts.doctor_jobs import DoctorState
from server.models.base import Base, now_column, project_column


class DoctorJob(Base):
    """One package through diagnosis, repair and proof (a worker, under a lease like a build's),
    then its repaired package registered as a model and an A/B sweep of the two submitted."""

    __tablename__ = "doctor_jobs"
    __table_args__ = (Index("ix_doctor_jobs_state_lease", "state", "lease_expires_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = project_column()
    submitted_by: Mapped[str] = mapped_column(String(128))
    package: Mapped[str] = mapped_column(String(48))
    # The package's content when the job was submitted (models are immutable, but a job keeps
    # what it diagnosed).
    package_sha256: Mapped[str] = mapped_column(String(64))
    tokenizer: Mapped[str] = mapped_column(String(64))
    prompts: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    devices: Mapped[list[Any]]
    state: Mapped[str] = mapped_column(String(16), default=DoctorState.queued)
    stage: Mapped[str | None] = mapped_column(String(200))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The DoctorReport (decodebench/contracts/doctor.py), hundreds of kB for a large package:
    # loaded only when asked for.
    report: Mapped[dict[str, Any] | None] = mapped_column(JSONB, deferred=True)
    artifact_sha256: Mapped[str | None] = mapped_column(String(64))
    repaired_model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"))
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
