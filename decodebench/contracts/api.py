"""What the REST API returns: every response body is one of these models.

The server builds them, the client parses them, the pages render them and ``/openapi.json``
publishes them, so a CI user can generate a typed client. Request bodies are the domain and
protocol models (:mod:`decodebench.contracts.domain`, :mod:`decodebench.contracts.protocol`,
:mod:`decodebench.contracts.results`, :mod:`decodebench.contracts.workers`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from decodebench.contracts.analysis import BytesPerToken
from decodebench.contracts.base import Contract
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import SweepSpec, VariantSpec
from decodebench.contracts.names import (
    DEFAULT_FORMAT,
    BuildState,
    DeviceStatus,
    Driver,
    FormatName,
    RunState,
    SweepState,
)
from decodebench.contracts.protocol import DeviceCheck
from decodebench.contracts.results import ThermalState
from decodebench.contracts.verdicts import OutputAgreement, VariantVerdict


class _Response(Contract):
    model_config = ConfigDict(extra="forbid")


class Health(_Response):
    status: str = Field(description="ok when the database answers")
    version: str


class RateSummary(_Response):
    """Mean of per-prompt rates with its 95% confidence half-width (Student t)."""

    n: int
    mean: float
    stdev: float
    ci95_half_width: float


class RunSummary(_Response):
    """What a succeeded run measured, over its prompts."""

    prompts: int
    decode_tok_s: RateSummary
    ttft_ms_mean: float
    load_time_cold_ms: float
    load_time_warm_ms: float
    peak_memory_bytes: int
    thermal_state_start: ThermalState
    thermal_state_end: ThermalState
    product_type: str
    os_version: str
    timing_model: str
    compile_peak_memory_bytes: int | None = None
    low_power_mode: bool | None = None
    thermal_wait_ms: float | None = None
    prompt_thermal_states: list[ThermalState] | None = None


class RunView(_Response):
    id: int
    variant: str = Field(description="The variant's label")
    device_class: str
    repetition: int
    order_key: int
    state: RunState
    attempts: int
    device_udid: str | None
    simulated: bool | None = Field(description="True when the timings did not come from hardware")
    driver: Driver | None
    failure_reason: str | None
    summary: RunSummary | None


class AnalysisSummary(_Response):
    """The headline figures of a build's analysis; predictions use the current profiles."""

    ops_total: int
    dispatch_ops: int
    tile_ops: int
    tile_output_bytes: int
    tile_output_mib: float
    redundant_ops: int = Field(description="Number of redundant copies per decoded token")
    redundant_output_bytes: int
    state_write_ops: int
    weight_bytes: int
    bytes_per_token: BytesPerToken
    predicted_tok_s: dict[str, float] = Field(description="Device class -> predicted tok/s")


class BuildView(_Response):
    id: int
    key: str
    model: str
    variant: VariantSpec
    label: str = Field(description="The variant's label")
    toolchain: dict[str, str]
    state: BuildState
    stage: str | None
    progress: float
    attempts: int
    error: str | None
    artifact_sha256: str | None
    analysis: AnalysisSummary | None


class BuildDetail(BuildView):
    report: BuildReport | None = Field(description="The build's build.json, once it succeeded")


class ComparisonRow(_Response):
    """One variant on one device class: measured against predicted, and against the first."""

    variant: str
    build_id: int
    build_state: BuildState
    device_class: str
    device_name: str
    runs_total: int
    runs_succeeded: int
    runs_failed: int
    prompts_measured: int
    decode_tok_s_mean: float | None
    decode_tok_s_ci95: float | None
    speedup_vs_first: float | None
    predicted_tok_s: float | None
    prediction_calibrated: bool
    prediction_source: str
    tile_ops: int | None
    tile_mib: float | None
    bytes_per_token: int | None
    simulated: bool | None = Field(description="True when any result came from a fake device")
    format: FormatName = Field(
        default=DEFAULT_FORMAT, description="The variant's model format (coreml, coreai)"
    )
    load_time_cold_ms: float | None = Field(
        default=None,
        description="Mean cold load of the succeeded runs: compiling the model on the device "
        "(for Core AI, the asset's specialization)",
    )
    load_time_warm_ms: float | None = Field(
        default=None, description="Mean warm load of the succeeded runs (compiled already)"
    )
    verdict: VariantVerdict | None = Field(
        default=None,
        description="Against the sweep's baseline variant on this device class: ratios with 95% "
        "bootstrap intervals, faster/slower/no change, output agreement (None for the baseline)",
    )
    reference_agreement: OutputAgreement | None = Field(
        default=None,
        description="Greedy tokens against the fp32 reference outputs (models with a tokenizer; "
        "None when no run recorded token ids)",
    )


class VerdictsView(_Response):
    """A sweep's variants judged against a baseline (its own baseline variant, or a sweep)."""

    sweep_id: int
    baseline: str = Field(description="What the variants are judged against")
    min_effect: float
    verdicts: list[VariantVerdict]
    note: str | None = Field(description="Why some or all verdicts are missing")


class SweepOverview(_Response):
    id: int
    model: str
    state: SweepState
    submitted_by: str
    created_at: datetime
    finished_at: datetime | None
    variants: list[str]
    devices: list[str]


class VariantAnswer(_Response):
    variant: str
    device_class: str | None = Field(description="Whose run's tokens these are; None: no run")
    text: str | None = Field(description="The greedy tokens as text; None when not recorded")
    first_divergence: int | None = Field(description="First token differing from the reference")


class PromptAnswers(_Response):
    """One prompt: the fp32 reference answer beside each variant's."""

    index: int
    prompt: str
    reference: str
    answers: list[VariantAnswer]


class SweepAnswers(_Response):
    """What a few prompts' answers read like, for a model with a tokenizer."""

    reference: str = Field(description="What made the reference answers")
    decode_tokens: int
    prompts: list[PromptAnswers]
    note: str | None = Field(default=None, description="Why some text is missing")


class SweepDetail(SweepOverview):
    spec: SweepSpec
    builds: list[BuildView]
    results: list[ComparisonRow]
    simulated: bool = Field(description="True when any result came from a fake device")
    runs: list[RunView]
    baseline: str = Field(description="The variant every other one is judged against")
    min_effect: float = Field(description="Smallest relative change a verdict counts")
    verdicts: list[VariantVerdict] = Field(description="Every variant against the baseline")
    verdicts_note: str | None = Field(description="Why some or all verdicts are missing")
    answers: SweepAnswers | None = Field(
        default=None, description="A few prompts' answers as text (models with a tokenizer)"
    )


class BuildStateView(_Response):
    state: BuildState


class RunStateView(_Response):
    state: RunState


class ResultsStored(_Response):
    run_id: int
    state: RunState
    prompts_stored: int


class Reenqueued(_Response):
    reenqueued: list[int]


class ArtifactStored(_Response):
    sha256: str


class DeviceView(_Response):
    """One device as its agent last reported it, including devices that went away."""

    udid: str
    device_class: str
    product_type: str
    os_version: str
    driver: Driver
    simulated: bool
    status: DeviceStatus
    status_detail: str
    connected: bool
    battery_level: int | None
    charging: bool | None
    thermal_state: ThermalState
    agent_id: int
    last_seen_at: datetime
    failed_checks: list[DeviceCheck] = Field(description="Why it is not ready, and the fix")


class ProfileParameter(_Response):
    name: str
    label: str
    unit: str
    value: float
    prior: float
    calibrated: bool


class FittedPoint(_Response):
    """One run in a calibration: its bytes and ops, measured against the fit's prediction."""

    build: str
    run_id: int | None
    bytes_per_token: int
    dispatch_ops: int
    measured_tok_s: float
    predicted_tok_s: float
    simulated: bool


class CalibrationView(_Response):
    id: int
    device_class: str
    effective_bandwidth_mb_s: float
    dispatch_overhead_us: float
    calibrated_parameters: list[str]
    runs: int
    builds: int
    includes_simulated: bool
    rms_relative_error: float
    note: str
    requested_by: str
    created_at: datetime | None
    points: list[FittedPoint] | None = None


class ProfileView(_Response):
    device_class: str
    display_name: str
    product_types: list[str]
    source: str
    calibrated: bool
    calibration_runs: int
    calibration_builds: int
    parameters: list[ProfileParameter]
    calibration: CalibrationView | None


class ProfileDetail(ProfileView):
    history: list[CalibrationView]


class FieldError(_Response):
    loc: list[str | int] = Field(description="Where the error is: body, query or path, then keys")
    msg: str
    type: str


class ErrorResponse(_Response):
    """Every error: a sentence, or for a request that does not validate, one entry per field."""

    detail: str | list[FieldError]
