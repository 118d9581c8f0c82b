"""Uploads and user models: the request and response bodies of ``/api/v1/uploads`` and
``/api/v1/models``.

An upload session receives one file in chunks at explicit offsets (``GET`` tells the offset
reached, so an interrupted upload resumes there) and, when finished with the file's sha256, puts
it into the content-addressed artifact store. A model names such files: a Hugging Face
checkpoint, a GGUF file, or a zipped package in a model format (a Core ML ``.mlpackage``).
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import ConfigDict, Field, StrictInt, field_validator, model_validator

from decodebench.contracts.base import Contract, Incoming
from decodebench.contracts.names import FormatName

SHA256_PATTERN = r"^[0-9a-f]{64}$"
# Short enough that "upload:<name>" fits the 64-character model columns.
MODEL_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,47}\Z")
UPLOAD_PREFIX = "upload:"


class ModelKind(StrEnum):
    hf = "hf"  # config.json + *.safetensors (+ tokenizer files)
    gguf = "gguf"  # one GGUF file, dequantized by the worker
    package = "package"  # one zipped package built elsewhere, in the model's format


# What older clients and stored rows called a Core ML package.
LEGACY_KINDS = {"mlpackage": ModelKind.package}


def check_model_name(value: str) -> str:
    if not MODEL_NAME.match(value):
        raise ValueError("must be 1-48 characters of letters, digits, '.', '_' or '-'")
    return value


class UploadCreate(Incoming):
    filename: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="The file's name: letters, digits, '.', '_' or '-' (no folders)",
    )
    size: StrictInt = Field(ge=1, le=2**62, description="The file's size in bytes")


class UploadFinish(Incoming):
    sha256: str = Field(pattern=SHA256_PATTERN, description="sha256 of the whole file")


class UploadView(Contract):
    model_config = ConfigDict(extra="forbid")

    id: str
    filename: str
    size: int
    offset: int = Field(description="Bytes received so far: send the next chunk from here")
    state: str = Field(description="open, or finished (the file is in the artifact store)")
    sha256: str | None = None
    created_by: str


class ModelFileRef(Incoming):
    path: str = Field(min_length=1, max_length=128, description="File name in the model")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Its address in the artifact store")


class ModelRegistration(Incoming):
    name: str = Field(description="Unique; a sweep names it as upload:<name>")
    kind: ModelKind | None = Field(default=None, description="Detected from the files if omitted")
    format: FormatName | None = Field(
        default=None, description="A package's model format (coreml when omitted)"
    )
    files: list[ModelFileRef] = Field(min_length=1, max_length=64)

    @field_validator("kind", mode="before")
    @classmethod
    def _legacy_kind(cls, value: object) -> object:
        return LEGACY_KINDS.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _format_of_a_package(self) -> ModelRegistration:
        if self.format is not None and self.kind not in (None, ModelKind.package):
            raise ValueError(f"format: only a package has a model format, not a {self.kind}")
        return self

    @field_validator("name")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        return check_model_name(value)


class ModelFileView(Contract):
    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str
    bytes: int


class ModelView(Contract):
    model_config = ConfigDict(extra="forbid")

    id: int
    name: str
    kind: ModelKind
    format: FormatName | None = Field(description="A package's model format; none for a checkpoint")
    architecture: str | None = Field(description="config.json's architecture, or GGUF's")
    content_sha256: str = Field(description="sha256 over path:sha256 lines: part of build keys")
    total_bytes: int
    files: list[ModelFileView]
    summary: dict[str, object] = Field(description="What the headers say: shape, parameters")
    created_by: str
    created_at: datetime


def upload_identity(
    model: str, model_content: str | None = None, package_content: str | None = None
) -> str:
    """The model identity a build key hashes (server and worker both derive it): a preset's
    name; ``upload:<name>@sha256:<content>`` for an uploaded checkpoint; with a package built
    elsewhere, its content as well. The same name with other files is another build."""
    identity = model if model_content is None else f"{model}@sha256:{model_content}"
    if package_content is not None:
        identity += f"+package@sha256:{package_content}"
    return identity
