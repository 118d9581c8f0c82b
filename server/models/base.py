"""What every table shares: the declarative base, its column helpers, the tokens' enums."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import DateTime, ForeignKey, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


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


def now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


def project_column(*, nullable: bool = False) -> Mapped[Any]:
    return mapped_column(ForeignKey("projects.id"), index=True, nullable=nullable)
