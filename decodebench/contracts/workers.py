"""The build worker protocol: the builds a worker is given, and what it reports back."""

from __future__ import annotations

from pydantic import Field, StrictFloat

from decodebench.contracts.base import Contract, Incoming
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import VariantSpec


class PromptSetRequest(Contract):
    """The prompts a build's reference outputs are computed for (texts None: the built-in chat
    set's first ``count``); ``identity`` is what the build key holds."""

    texts: list[str] | None = None
    count: int = Field(ge=1)
    decode_tokens: int = Field(ge=1)
    identity: dict[str, object]


class BuildAssignment(Contract):
    build_id: int
    key: str
    model: str
    variant: VariantSpec
    state: str
    toolchain: dict[str, str] = Field(description="The toolchain the build is keyed by")
    prompt_set: PromptSetRequest | None = Field(
        default=None,
        description="For a model with a tokenizer: the prompts to compute reference outputs for",
    )


LEASE_PATTERN = r"^[0-9a-f]{32}$"


class BuildStart(Contract):
    """The answer to a worker asking to build: go ahead under this lease, or not."""

    proceed: bool
    state: str
    lease: str | None = Field(default=None, description="Send it with every later report")
    lease_seconds: float | None = Field(default=None, description="Renew before it runs out")


class WorkerIdentity(Incoming):
    worker: str = Field(min_length=1, max_length=255)


class BuildLease(Incoming):
    """What proves a worker still holds the build it reports on."""

    lease: str = Field(pattern=LEASE_PATTERN)


class BuildProgress(BuildLease):
    stage: str = Field(min_length=1, max_length=64)
    fraction: StrictFloat = Field(ge=0, le=1)


class BuildOutcome(BuildLease):
    """A finished build: the artifact's address plus its build.json (report and analysis)."""

    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    report: BuildReport = Field(description="build.json as written by the builder")


class BuildFailure(BuildLease):
    reason: str = Field(min_length=1, max_length=4000)
