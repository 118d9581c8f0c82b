"""Files a project uploads, and the models it brings from them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import BigInteger, String

from server.models.base import Base, now_column, project_column


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
    project_id: Mapped[int] = project_column()
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class UserModel(Base):
    """A model a user brought: files in the artifact store, checked when registered."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(48), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    # A package's model format (coreml); none for a checkpoint.
    format: Mapped[str | None] = mapped_column(String(16))
    architecture: Mapped[str | None] = mapped_column(String(128))
    content_sha256: Mapped[str] = mapped_column(String(64))
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[Any]]
    summary: Mapped[dict[str, Any]]
    created_by: Mapped[str] = mapped_column(String(128))
    # Whose it is: another project's models are not shown, listed, used nor downloaded. The
    # name stays unique across the server (a build worker fetches a model by its name).
    project_id: Mapped[int] = project_column()
    created_at: Mapped[datetime] = now_column()
