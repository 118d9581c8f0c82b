"""Who may do what: projects, API tokens, the browser's sign-in sessions and failures."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.types import BigInteger, DateTime, String

from server.models.base import Base, now_column, project_column

DEFAULT_PROJECT = "default"


class Project(Base):
    """Who owns sweeps, schedules and calibrations; a user token belongs to one project and sees
    nothing of another's (server/tenancy.py decides what is visible)."""

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = now_column()


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = now_column()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # What a user token may do (read, submit, admin); agent and worker tokens ignore it.
    scopes: Mapped[list[Any]] = mapped_column(
        JSONB, server_default=text('\'["read", "submit"]\'::jsonb')
    )
    # A user token's project; agent and worker tokens serve every project (None).
    project_id: Mapped[int | None] = project_column(nullable=True)


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
    created_at: Mapped[datetime] = now_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    token: Mapped[ApiToken] = relationship(lazy="joined")


class SignInFailure(Base):
    """One refused sign-in, counted per client address to rate-limit guessing."""

    __tablename__ = "sign_in_failures"
    __table_args__ = (Index("ix_sign_in_failures_client_at", "client", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    client: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = now_column()
