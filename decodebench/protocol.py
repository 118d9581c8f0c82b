"""Messages between the server and its remote roles (agents, build workers) and run results.

One schema, many users: the server validates against these, the agent and worker build them,
and the iOS harness writes `results.json` in the `RunResult` shape.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

from decodebench.domain import VariantSpec

PROTOCOL_VERSION = 1


class ThermalState(StrEnum):
    nominal = "nominal"
    fair = "fair"
    serious = "serious"
    critical = "critical"
    unknown = "unknown"


class DeviceInfo(BaseModel):
    """One device as an agent sees it."""

    model_config = ConfigDict(extra="forbid")

    udid: str = Field(min_length=1, max_length=128)
    device_class: str = Field(min_length=1, max_length=64)
    product_type: str = Field(min_length=1, max_length=64, description="e.g. iPhone17,1")
    os_version: str = Field(default="", max_length=32)
    driver: str = Field(description="simulated, emulated, pymobiledevice3 or host")
    simulated: bool = Field(description="True when timings do not come from a real device")
    battery_level: int | None = Field(default=None, ge=0, le=100)
    charging: bool | None = None
    thermal_state: ThermalState = ThermalState.unknown
    status: str = Field(
        default="ready", max_length=64, description="ready, busy, cooling, locked …"
    )


class AgentRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    hostname: str = Field(default="", max_length=255)
    version: str = Field(default="", max_length=64)
    devices: list[DeviceInfo] = Field(default_factory=list)


class AgentRegistered(BaseModel):
    agent_id: int
    heartbeat_interval_s: float
    lease_seconds: int


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    devices: list[DeviceInfo] = Field(default_factory=list)


class ClaimRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_udid: str = Field(min_length=1, max_length=128)


class RunAssignment(BaseModel):
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
    lease_expires_at: str
    lease_seconds: int


class ClaimResponse(BaseModel):
    run: RunAssignment | None = None


class PromptResult(BaseModel):
    """One prompt of the decode sweep on one device."""

    model_config = ConfigDict(extra="forbid")

    prompt_index: int = Field(ge=0, lt=1000)
    prompt_tokens: int = Field(ge=1)
    generated_tokens: int = Field(ge=1)
    ttft_ms: float = Field(
        ge=0,
        description="Time to first token: the summed time of the prompt's prefill steps, the last "
        "of which yields the first generated token (decodebench.harness)",
    )
    prefill_tok_s: float = Field(gt=0)
    decode_tok_s: float = Field(gt=0)
    token_latencies_ms: list[float] = Field(min_length=1)
    token_ids: list[int] | None = Field(default=None, description="Greedy tokens, when known")

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


class RunResult(BaseModel):
    """What a device run produced: the harness's results.json, validated on upload."""

    model_config = ConfigDict(extra="forbid")

    protocol_version: int = PROTOCOL_VERSION
    device_udid: str
    device_class: str
    product_type: str
    os_version: str = ""
    driver: str
    simulated: bool
    load_time_cold_ms: float = Field(ge=0)
    load_time_warm_ms: float = Field(ge=0)
    peak_memory_bytes: int = Field(
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


class RunFailure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000)
    retryable: bool = True


class LeaseRenewal(BaseModel):
    lease_expires_at: str


# Build workers


class BuildAssignment(BaseModel):
    build_id: int
    key: str
    model: str
    variant: VariantSpec
    state: str
    toolchain: dict[str, str] = Field(description="The toolchain the build is keyed by")


class BuildStart(BaseModel):
    proceed: bool
    state: str


class BuildProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str = Field(min_length=1, max_length=64)
    fraction: float = Field(ge=0, le=1)


class BuildOutcome(BaseModel):
    """A finished build: the artifact's address plus its build.json (report and analysis)."""

    model_config = ConfigDict(extra="forbid")

    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    report: dict[str, Any] = Field(description="build.json as written by the builder")


class BuildFailure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=4000)
