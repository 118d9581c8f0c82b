"""Sweeps, their builds and variants, their runs, the runs' prompt results, and every
state change (transitions)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.types import BigInteger, Boolean, DateTime, Float, Integer, String, Text

from decodebench.contracts.names import BuildState, RunState, SweepState
from server.models.base import Base, now_column, project_column


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=SweepState.building)
    submitted_by: Mapped[str] = mapped_column(String(128))
    project_id: Mapped[int] = project_column()
    created_at: Mapped[datetime] = now_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A finished sweep's verdicts, stored once (server/sweeps/verdict_cache.py); tens of kB for
    # a large sweep, so loaded only when asked for (the sweeps list loads a hundred rows).
    verdict_cache: Mapped[dict[str, Any] | None] = mapped_column(JSONB, deferred=True)
    # ci, nightly or adhoc: weighs the sweep's share of its device classes (server/runs/queue.py).
    priority: Mapped[str] = mapped_column(String(16), server_default="adhoc")

    variants: Mapped[list[SweepVariant]] = relationship(
        back_populates="sweep", order_by="SweepVariant.position"
    )


class Build(Base):
    """One artifact, shared by every sweep that asks for the same variant of the same model."""

    __tablename__ = "builds"
    __table_args__ = (Index("ix_builds_state_lease", "state", "lease_expires_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    model: Mapped[str] = mapped_column(String(64))
    variant: Mapped[dict[str, Any]]
    toolchain: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=BuildState.queued)
    stage: Mapped[str | None] = mapped_column(String(64))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    artifact_sha256: Mapped[str | None] = mapped_column(String(64))
    report: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The worker building it holds this lease and renews it; once it expires the build is
    # queued again (or failed after its last attempt), so a killed worker loses nothing.
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SweepVariant(Base):
    __tablename__ = "sweep_variants"
    __table_args__ = (UniqueConstraint("sweep_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(64))
    variant: Mapped[dict[str, Any]]
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)

    sweep: Mapped[Sweep] = relationship(back_populates="variants")
    build: Mapped[Build] = relationship()


class Run(Base):
    """One variant on one device class for one repetition: the unit an agent claims."""

    __tablename__ = "runs"
    __table_args__ = (
        Index(
            "ix_runs_claim_order",
            "sweep_id",
            "device_class",
            "state",
            "attempts",
            "order_key",
            "id",
        ),
        Index("ix_runs_sweep_class_started", "sweep_id", "device_class", "started_at"),
        Index("ix_runs_device_state", "device_udid", "state"),
        Index("ix_runs_state_lease", "state", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    sweep_variant_id: Mapped[int] = mapped_column(ForeignKey("sweep_variants.id"))
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)
    device_class: Mapped[str] = mapped_column(String(64))
    repetition: Mapped[int] = mapped_column(Integer, default=0)
    order_key: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default=RunState.waiting_build, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    device_udid: Mapped[str | None] = mapped_column(String(128))
    agent_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id"))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The key of the claim that holds it: the same key from the same device gets it again.
    claim_key: Mapped[str | None] = mapped_column(String(64))
    failure_reason: Mapped[str | None] = mapped_column(Text)
    simulated: Mapped[bool | None] = mapped_column(Boolean)
    driver: Mapped[str | None] = mapped_column(String(32))
    summary: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = now_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    variant: Mapped[SweepVariant] = relationship()


class PromptResultRow(Base):
    __tablename__ = "prompt_results"
    __table_args__ = (UniqueConstraint("run_id", "prompt_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    prompt_index: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    generated_tokens: Mapped[int] = mapped_column(Integer)
    ttft_ms: Mapped[float] = mapped_column(Float)
    prefill_tok_s: Mapped[float] = mapped_column(Float)
    decode_tok_s: Mapped[float] = mapped_column(Float)
    token_latencies_ms: Mapped[list[Any]]
    token_ids: Mapped[list[Any] | None]
    simulated: Mapped[bool] = mapped_column(Boolean)


class Transition(Base):
    """Every state change of a sweep, build or run, with when and why."""

    __tablename__ = "transitions"
    __table_args__ = (Index("ix_transitions_entity", "entity", "entity_id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    entity: Mapped[str] = mapped_column(String(16))
    entity_id: Mapped[int] = mapped_column(Integer)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = now_column()
