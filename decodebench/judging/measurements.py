"""What the judge reads: per-prompt results grouped by run, as a sweep measures them."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from decodebench.contracts.results import RunResult


class PromptMeasurement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_index: int = Field(ge=0)
    decode_tok_s: float = Field(gt=0)
    ttft_ms: float = Field(gt=0)
    token_ids: tuple[int, ...] | None = None

    @field_validator("decode_tok_s", "ttft_ms")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class RunMeasurement(BaseModel):
    """One run of one variant on one device: the unit the design blocks on (A B B A)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repetition: int = Field(ge=0, description="Which A B B A round; pairs the variants' runs")
    device_udid: str = ""
    peak_memory_bytes: int = Field(ge=0)
    prompts: tuple[PromptMeasurement, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_prompts(self) -> RunMeasurement:
        indexes = [prompt.prompt_index for prompt in self.prompts]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"run of repetition {self.repetition} repeats a prompt_index")
        return self

    @classmethod
    def from_run_result(cls, result: RunResult, repetition: int) -> RunMeasurement:
        return cls(
            repetition=repetition,
            device_udid=result.device_udid,
            peak_memory_bytes=result.peak_memory_bytes,
            prompts=tuple(
                PromptMeasurement(
                    prompt_index=prompt.prompt_index,
                    decode_tok_s=prompt.decode_tok_s,
                    ttft_ms=prompt.ttft_ms,
                    token_ids=None if prompt.token_ids is None else tuple(prompt.token_ids),
                )
                for prompt in result.prompts
            ),
        )

    def by_prompt(self) -> dict[int, PromptMeasurement]:
        return {prompt.prompt_index: prompt for prompt in self.prompts}


class VariantRuns(BaseModel):
    """Every succeeded run of one variant on one device class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: str = Field(min_length=1)
    device_class: str = Field(min_length=1)
    runs: tuple[RunMeasurement, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_repetitions(self) -> VariantRuns:
        repetitions = [run.repetition for run in self.runs]
        if len(set(repetitions)) != len(repetitions):
            raise ValueError(f"variant {self.variant!r}: two runs share a repetition")
        return self

    def by_repetition(self) -> dict[int, RunMeasurement]:
        return {run.repetition: run for run in self.runs}
