"""The build worker protocol: the builds a worker is given, and what it reports back (the lease,
progress and failure reports are every leased kind's: decodebench/contracts/leases.py)."""

from __future__ import annotations

from pydantic import Field

from decodebench.contracts.base import Contract
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.leases import Lease


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


class BuildOutcome(Lease):
    """A finished build: the artifact's address plus its build.json (report and analysis)."""

    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    report: BuildReport = Field(description="build.json as written by the builder")
