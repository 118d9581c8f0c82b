"""The agents, their devices, and the device profiles' calibrations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import Boolean, Float, Integer, String, Text

from server.models.base import Base, now_column, project_column


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    hostname: Mapped[str] = mapped_column(String(255), default="")
    version: Mapped[str] = mapped_column(String(64), default="")
    registered_at: Mapped[datetime] = now_column()
    last_seen_at: Mapped[datetime] = now_column()


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
    last_seen_at: Mapped[datetime] = now_column()
    # The preconditions the agent found failing, each with its fix (DeviceCheck).
    failed_checks: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    # Pinned by an operator (python -m server.manage pin-device): it claims only this project's
    # runs and only this project sees it. None: shared by every project.
    project_id: Mapped[int | None] = project_column(nullable=True)


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
    project_id: Mapped[int] = project_column()
    created_at: Mapped[datetime] = now_column()
