"""A build's report (``build.json``): what was built, how, and what its graph costs.

Validated once, when a worker completes a build; everything else reads it through
:class:`BuildReport`. Defaults keep reports written by earlier versions readable.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.base import Contract
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import ModelConfig

METHOD = "kl_next_token_vs_fp16"


class LayerSensitivity(Contract):
    model_config = ConfigDict(frozen=True)

    layer: int
    kl: float = Field(description="Mean KL(fp16 || only this layer quantized), nats per token")


class SensitivityReport(Contract):
    """What build.json stores: the ranking and how it was measured."""

    model_config = ConfigDict(frozen=True)

    method: str = METHOD
    schemes: dict[str, str] = Field(description="The scheme each layer's weights were tried at")
    calibration: str
    tokens: int
    ranking: list[LayerSensitivity] = Field(description="Most sensitive first")
    promoted: list[int]
    seconds: float = 0.0
    # Added with the ranking cache; defaults keep older build.json files readable.
    arithmetic: str = "fp32"
    measured_by: str | None = Field(
        default=None, description="Build key whose run measured this ranking when it was reused"
    )


class QuantSummary(Contract):
    """What quantization did, and why: each weight's scheme, promoted layers, their ranking."""

    model_config = ConfigDict(extra="forbid")

    recipe: str
    schemes: dict[str, str] = Field(description="Target -> scheme before promotion")
    promoted_layers: list[int]
    constexpr_ops: dict[str, int] = Field(description="Compressed op type -> count")
    weights: dict[str, str] = Field(description="Parameter name -> scheme it was stored with")
    sensitivity: SensitivityReport | None = None


class ReferencePrompt(Contract):
    """One prompt as the devices decode it, and what transformers in fp32 answers."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    text: str
    token_ids: list[int] = Field(min_length=1, description="Through the model's chat template")
    reference_ids: list[int] = Field(description="fp32 greedy tokens, decode_tokens of them")
    reference_text: str = Field(description="reference_ids decoded by the model's tokenizer")


class ReferenceOutputs(Contract):
    """The prompts of a model with a tokenizer and their fp32 reference outputs, computed by the
    worker once per (model, prompt set, decode tokens) and carried by every build that needs them.
    ``detokenizer_sha256`` is an artifact: each token id's bytes as hex, so the server turns
    greedy tokens into text without a tokenizer library (decodebench.detokenize)."""

    model_config = ConfigDict(frozen=True)

    reference: str = Field(description="What computed reference_ids, e.g. transformers fp32 greedy")
    prompt_set: str = Field(description="chat-v1 or custom")
    identity: dict[str, object] = Field(description="The prompts and decode length keyed")
    decode_tokens: int = Field(ge=1)
    prompts: list[ReferencePrompt] = Field(min_length=1)
    detokenizer_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    seconds: float = 0.0


class BuildReport(Contract):
    model_config = ConfigDict(extra="forbid")

    key: str
    model: str
    variant: VariantSpec
    config: ModelConfig
    toolchain: dict[str, str]
    stage_seconds: dict[str, float]
    peak_rss_bytes: int
    package: str
    analysis: GraphAnalysis
    # Added with builds-as-a-service; defaults keep older build.json files readable.
    model_identity: str = ""
    weights_path: str | None = None
    functions: list[str] = Field(default_factory=lambda: ["main"])
    quant: QuantSummary | None = None
    wall_seconds: float = 0.0
    cache_hit: bool = False
    # Added with real prompts: only builds of models with a tokenizer carry them.
    references: ReferenceOutputs | None = None
    reference_check: str | None = Field(
        default=None,
        description="How the build's decode agreed with its format's own runtime (Core AI: "
        "Apple's, op by op), or why it was not held; none where no such runtime runs here",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="Faults the format's runtime is known to have on phones that this program "
        "would meet, each naming its op and cause",
    )
