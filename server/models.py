"""Database tables. The schema itself is created only by Alembic migrations."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from decodebench.contracts.names import (  # noqa: F401  (re-exported for the server's modules)
    TERMINAL_RUN_STATES,
    BuildState,
    RunState,
    SweepState,
)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class TokenKind(StrEnum):
    user = "user"
    agent = "agent"
    worker = "worker"


class Scope(StrEnum):
    read = "read"  # see sweeps, builds, devices and profiles
    submit = "submit"  # submit sweeps, calibrate profiles
    admin = "admin"  # fail or rebuild any build


DEFAULT_SCOPES = (Scope.read, Scope.submit)


def _now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


DEFAULT_PROJECT = "default"


class Project(Base):
    """Who owns sweeps, schedules and calibrations; a user token belongs to one project and sees
    nothing of another's (server/tenancy.py decides what is visible)."""

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = _now_column()


def _project_column(*, nullable: bool = False) -> Mapped[Any]:
    return mapped_column(ForeignKey("projects.id"), index=True, nullable=nullable)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = _now_column()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # What a user token may do (read, submit, admin); agent and worker tokens ignore it.
    scopes: Mapped[list[Any]] = mapped_column(
        JSONB, server_default=text('\'["read", "submit"]\'::jsonb')
    )
    # A user token's project; agent and worker tokens serve every project (None).
    project_id: Mapped[int | None] = _project_column(nullable=True)


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=SweepState.building)
    submitted_by: Mapped[str] = mapped_column(String(128))
    project_id: Mapped[int] = _project_column()
    created_at: Mapped[datetime] = _now_column()
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
    created_at: Mapped[datetime] = _now_column()
    updated_at: Mapped[datetime] = _now_column()
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


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    hostname: Mapped[str] = mapped_column(String(255), default="")
    version: Mapped[str] = mapped_column(String(64), default="")
    registered_at: Mapped[datetime] = _now_column()
    last_seen_at: Mapped[datetime] = _now_column()


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    udid: Mapped[str] = mapped_column(String(128), unique=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("agents.id"), index=True)
    device_class: Mapped[str] = mapped_column(String(64))
    product_type: Mapped[str] = mapped_column(String(64))
    os_version: Mapped[str] = mapped_column(String(32), default="")
    driver: Mapped[str] = mapped_column(String(32))
    simulated: Mapped[bool] = mapped_column(Boolean)
    battery_level: Mapped[int | None] = mapped_column(Integer)
    charging: Mapped[bool | None] = mapped_column(Boolean)
    thermal_state: Mapped[str] = mapped_column(String(16), default="unknown")
    status: Mapped[str] = mapped_column(String(64), default="ready")
    status_detail: Mapped[str] = mapped_column(String(200), default="", server_default="")
    connected: Mapped[bool] = mapped_column(Boolean, default=True)
    last_seen_at: Mapped[datetime] = _now_column()
    # The preconditions the agent found failing, each with its fix (DeviceCheck).
    failed_checks: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    # Pinned by an operator (python -m server.manage pin-device): it claims only this project's
    # runs and only this project sees it. None: shared by every project.
    project_id: Mapped[int | None] = _project_column(nullable=True)


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
    created_at: Mapped[datetime] = _now_column()
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
    at: Mapped[datetime] = _now_column()


class ProfileCalibration(Base):
    """One least-squares fit of a device class's profile to its runs (see server/profiles)."""

    __tablename__ = "profile_calibrations"
    __table_args__ = (Index("ix_profile_calibrations_device_class", "device_class", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_class: Mapped[str] = mapped_column(String(64))
    effective_bandwidth_mb_s: Mapped[float] = mapped_column(Float)
    dispatch_overhead_us: Mapped[float] = mapped_column(Float)
    calibrated_parameters: Mapped[list[Any]]
    runs: Mapped[int] = mapped_column(Integer)
    builds: Mapped[int] = mapped_column(Integer)
    includes_simulated: Mapped[bool] = mapped_column(Boolean)
    rms_relative_error: Mapped[float] = mapped_column(Float)
    note: Mapped[str] = mapped_column(Text, default="")
    points: Mapped[list[Any]]
    requested_by: Mapped[str] = mapped_column(String(128))
    project_id: Mapped[int] = _project_column()
    created_at: Mapped[datetime] = _now_column()


class UiSession(Base):
    """A signed-in browser: the cookie holds a random id whose hash is stored here, never the
    API token, so signing out (or revoking the token) ends it on the server."""

    __tablename__ = "ui_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    token: Mapped[ApiToken] = relationship(lazy="joined")


class SignInFailure(Base):
    """One refused sign-in, counted per client address to rate-limit guessing."""

    __tablename__ = "sign_in_failures"
    __table_args__ = (Index("ix_sign_in_failures_client_at", "client", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    client: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = _now_column()


class Schedule(Base):
    """A sweep spec run on a cron schedule, watched night after night (see server/schedules)."""

    __tablename__ = "schedules"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    project_id: Mapped[int] = _project_column()
    spec: Mapped[dict[str, Any]]
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64))
    min_effect: Mapped[float] = mapped_column(Float)
    owner: Mapped[str] = mapped_column(String(128))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_secret: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = _now_column()


class ScheduleFiring(Base):
    """One due time of a schedule and the sweep it started. The unique (schedule, due time)
    is what makes a due time fire exactly once, whichever beat asks first."""

    __tablename__ = "schedule_firings"
    __table_args__ = (UniqueConstraint("schedule_id", "due_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    due_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    trigger: Mapped[str] = mapped_column(String(16))  # cron / run-now
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = _now_column()
    # Filled when the sweep has finished: what it ran on, and each (variant, device) mean.
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    context: Mapped[dict[str, Any] | None]
    values: Mapped[dict[str, Any] | None]


class Alert(Base):
    """A change in one (schedule, variant, device class) series: suspected, then confirmed or
    dismissed by a re-run on the same builds."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_schedule", "schedule_id", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    variant: Mapped[str] = mapped_column(String(64))
    device_class: Mapped[str] = mapped_column(String(64))
    direction: Mapped[str] = mapped_column(String(16))  # regression / improvement
    status: Mapped[str] = mapped_column(String(16))  # suspected / confirmed / dismissed
    last_good_firing_id: Mapped[int] = mapped_column(ForeignKey("schedule_firings.id"))
    first_bad_firing_id: Mapped[int] = mapped_column(ForeignKey("schedule_firings.id"))
    last_good_sweep_id: Mapped[int | None] = mapped_column(Integer)
    first_bad_sweep_id: Mapped[int | None] = mapped_column(Integer)
    confirmation_sweep_id: Mapped[int | None] = mapped_column(Integer)
    suspect: Mapped[dict[str, Any]]
    confirmation: Mapped[dict[str, Any] | None]
    ratio: Mapped[dict[str, Any] | None]
    changed: Mapped[list[Any] | None]
    build_diff: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now_column()
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookDelivery(Base):
    """One notification for a schedule's webhook; every attempt is its own row."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default="pending")  # delivered / failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = _now_column()
    created_at: Mapped[datetime] = _now_column()


class WebhookAttempt(Base):
    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = _now_column()


class Upload(Base):
    """One file arriving in chunks; its bytes wait in ``<artifact_dir>/uploads/<id>`` until it is
    finished with its sha256 and moved into the content-addressed store."""

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    filename: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="open")
    sha256: Mapped[str | None] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(128))
    project_id: Mapped[int] = _project_column()
    created_at: Mapped[datetime] = _now_column()
    updated_at: Mapped[datetime] = _now_column()


class UserModel(Base):
    """A model a user brought: files in the artifact store, checked when registered."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(48), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    architecture: Mapped[str | None] = mapped_column(String(128))
    content_sha256: Mapped[str] = mapped_column(String(64))
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[Any]]
    summary: Mapped[dict[str, Any]]
    created_by: Mapped[str] = mapped_column(String(128))
    # Whose it is: another project's models are not shown, listed, used nor downloaded. The
    # name stays unique across the server (a build worker fetches a model by its name).
    project_id: Mapped[int] = _project_column()
    created_at: Mapped[datetime] = _now_column()
