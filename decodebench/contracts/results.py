"""The harness protocol: what a device run produces, the `results.json` every harness writes.

The iOS harness (Swift), the emulated and host harnesses (decodebench.harness) write it;
the agent uploads it and the server validates it against :class:`RunResult`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from decodebench.contracts.base import Incoming

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
