"""Messages between the server and its remote roles (agents, build workers) and run results.

One schema, many users: the server validates against these, the agent and worker build them,
and the iOS harness writes `results.json` in the `RunResult` shape.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from decodebench.contracts.base import Contract, Incoming
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import Driver
from decodebench.profiles import DeviceProfile

PROTOCOL_VERSION = 1
# No phone decodes a billion tokens a second: a rate above this is a corrupt figure, and two of
# them must still add up to a finite mean.
MAX_RATE = 1e9


class ThermalState(StrEnum):
    nominal = "nominal"
    fair = "fair"
    serious = "serious"
    critical = "critical"
    unknown = "unknown"


class DeviceCheck(Incoming):
    """One precondition of a device for runs (paired, developer mode, disk image …)."""

    name: str = Field(max_length=64)
    ok: StrictBool | None = Field(description="None: could not be told (e.g. the queue is unknown)")
    detail: str = Field(default="", max_length=512)
    fix: str = Field(default="", max_length=512, description="One line an operator can act on")


class DeviceInfo(Incoming):
    """One device as an agent sees it."""

    model_config = ConfigDict(extra="forbid")

    udid: str = Field(min_length=1, max_length=128)
    device_class: str = Field(min_length=1, max_length=64)
    product_type: str = Field(min_length=1, max_length=64, description="e.g. iPhone17,1")
    os_version: str = Field(default="", max_length=32)
    driver: Driver = Field(description="simulated, emulated, pymobiledevice3 or host")
    simulated: StrictBool = Field(description="True when timings do not come from a real device")
    battery_level: StrictInt | None = Field(default=None, ge=0, le=100)
    charging: StrictBool | None = None
    thermal_state: ThermalState = ThermalState.unknown
    status: str = Field(
        default="ready", max_length=64, description="ready, busy, cooling, locked …"
    )
    failed_checks: list[DeviceCheck] = Field(
        default_factory=list,
        description="Preconditions that fail, each with its fix (pymobiledevice3 and emulated)",
    )


class AgentRegistration(Incoming):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    hostname: str = Field(default="", max_length=255)
    version: str = Field(default="", max_length=64)
    devices: list[DeviceInfo] = Field(default_factory=list)


class AgentRegistered(Contract):
    agent_id: int
    heartbeat_interval_s: float
    lease_seconds: int


class Heartbeat(Incoming):
    model_config = ConfigDict(extra="forbid")

    devices: list[DeviceInfo] = Field(default_factory=list)


class ClaimRequest(Incoming):
    model_config = ConfigDict(extra="forbid")

    device_udid: str = Field(min_length=1, max_length=128)


class RunAssignment(Contract):
    """Everything an agent needs to execute one run on one device."""

    run_id: int
    sweep_id: int
    build_id: int
    model: str
    variant: VariantSpec
    variant_label: str
    device_class: str
    prompts: int
    decode_tokens: int
    artifact_sha256: str
    artifact_url: str
    bytes_per_token: int = Field(description="Total bytes moved per decoded token (analysis)")
    vocab_size: int | None = Field(
        default=None, description="The built model's vocabulary (an uploaded model has no preset)"
    )
    lease_expires_at: str
    lease_seconds: int
    # Added with real prompts; defaults keep the built-in pseudo-token prompts.
    prompt_set_version: str | None = Field(
        default=None, description="builtin-v1, chat-v1 or custom; None: builtin-v1"
    )
    prompt_texts: list[str] | None = Field(
        default=None, description="The sweep's own prompts, pseudo-tokenized (no tokenizer)"
    )
    prompt_token_ids: list[list[int]] | None = Field(
        default=None, description="Token ids through the model's tokenizer and chat template"
    )
    dispatch_ops: int = Field(
        default=0, ge=0, description="Dispatched ops per decoded token (analysis)"
    )
    device_profile: DeviceProfile | None = Field(
        default=None,
        description="The device class's profile as the server's predictions use it (calibrated "
        "when a calibration is in force): simulated devices time the run with it",
    )


class ClaimResponse(Contract):
    run: RunAssignment | None = None


class PromptResult(Incoming):
    """One prompt of the decode sweep on one device."""

    model_config = ConfigDict(extra="forbid")

    prompt_index: StrictInt = Field(ge=0, lt=1000)
    prompt_tokens: StrictInt = Field(ge=1)
    generated_tokens: StrictInt = Field(ge=1)
    ttft_ms: StrictFloat = Field(
        ge=0,
        description="Time to first token: the summed time of the prompt's prefill steps, the last "
        "of which yields the first generated token (decodebench.harness)",
    )
    prefill_tok_s: StrictFloat = Field(gt=0, le=MAX_RATE)
    decode_tok_s: StrictFloat = Field(gt=0, le=MAX_RATE)
    token_latencies_ms: list[Annotated[StrictFloat, Field(ge=0)]] = Field(min_length=1)
    token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = Field(
        default=None, description="Greedy tokens, when known"
    )

    @model_validator(mode="after")
    def _one_latency_per_token(self) -> PromptResult:
        if len(self.token_latencies_ms) != self.generated_tokens:
            raise ValueError(
                f"token_latencies_ms has {len(self.token_latencies_ms)} entries "
                f"for {self.generated_tokens} generated tokens"
            )
        if self.token_ids is not None and len(self.token_ids) != self.generated_tokens:
            raise ValueError("token_ids must have one id per generated token")
        return self


class RunResult(Incoming):
    """What a device run produced: the harness's results.json, validated on upload."""

    model_config = ConfigDict(extra="forbid")

    protocol_version: StrictInt = PROTOCOL_VERSION
    device_udid: str
    device_class: str
    product_type: str
    os_version: str = ""
    driver: str
    simulated: StrictBool
    load_time_cold_ms: StrictFloat = Field(ge=0)
    load_time_warm_ms: StrictFloat = Field(ge=0)
    peak_memory_bytes: StrictInt = Field(
        ge=0,
        description="Largest physical footprint sampled after every step of the timed prompts "
        "(decode-time memory; compilation excluded, see decodebench.harness)",
    )
    compile_peak_memory_bytes: StrictInt | None = Field(
        default=None, ge=0, description="Footprint peak through on-device compile and loads"
    )
    low_power_mode: StrictBool | None = Field(
        default=None, description="Low Power Mode during the run"
    )
    thermal_wait_ms: StrictFloat | None = Field(
        default=None, ge=0, description="Time waited for a nominal thermal state before timing"
    )
    prompt_thermal_states: list[ThermalState] | None = Field(
        default=None, description="Thermal state sampled right after each prompt, in order"
    )
    thermal_state_start: ThermalState = ThermalState.unknown
    thermal_state_end: ThermalState = ThermalState.unknown
    timing_model: str = Field(
        default="", description="How timings were obtained when simulated (the stated model)"
    )
    prompts: list[PromptResult] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_prompts(self) -> RunResult:
        samples = self.prompt_thermal_states
        if samples is not None and len(samples) != len(self.prompts):
            raise ValueError(
                f"{len(samples)} prompt_thermal_states for {len(self.prompts)} prompts"
            )
        if self.protocol_version != PROTOCOL_VERSION:
            raise ValueError(
                f"results speak protocol {self.protocol_version}, this side speaks "
                f"{PROTOCOL_VERSION}: use a harness of the agent's release"
            )
        indexes = [prompt.prompt_index for prompt in self.prompts]
        if len(set(indexes)) != len(indexes):
            raise ValueError("prompt_index values must be distinct")
        return self


class RunFailure(Incoming):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000)
    retryable: StrictBool = True


class LeaseRenewal(Contract):
    lease_expires_at: str


# Build workers


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
