"""What every format's package carries beside its graph, because the analysis cannot read it
off the ops: the context, and the window and caches of sliding-window layers."""

from __future__ import annotations

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import (
    METADATA_CONTEXT,
    METADATA_SLIDING_CACHES,
    METADATA_SLIDING_WINDOW,
)
from decodebench.contracts.presets import ModelConfig
from decodebench.modeling.families import family_for


def build_metadata(config: ModelConfig, variant: VariantSpec) -> dict[str, str]:
    """The context and the sliding layers' window and cache names (none without them)."""
    family = family_for(config)
    sliding = [index for index in range(config.num_layers) if family.sliding(config, index)]
    if not sliding or config.sliding_window is None:
        return {}
    names = [f"{kind}_cache_{index}" for index in sliding for kind in ("key", "value")]
    return {
        METADATA_CONTEXT: str(variant.context),
        METADATA_SLIDING_WINDOW: str(config.sliding_window),
        METADATA_SLIDING_CACHES: ",".join(names),
    }
