"""What a build's graph costs per decoded token: the analysis as it is stored and served.

The analyser (:mod:`decodebench.analysis.analyze`) fills these from a saved ``.mlpackage``; the server,
the CLI and the pages only read them, so they live here without coremltools. Predictions use the
one prediction function, :meth:`decodebench.contracts.profiles.DeviceProfile.predicted_tok_s`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ConfigDict, SerializationInfo, model_serializer, model_validator

from decodebench.contracts.base import Contract
from decodebench.contracts.profiles import DEVICE_PROFILES, DeviceProfile


class KvState(Contract):
    """One KV-cache state of the decode function."""

    model_config = ConfigDict(frozen=True)

    name: str
    shape: list[int]
    dtype: str
    bytes: int
    positions: int = 0
    bytes_per_position: int = 0
    read: bool = True
    # A sliding-window layer's cache: the layer sees at most this many positions (0: all).
    window: int = 0

    def read_at(self, position: int) -> int:
        """Bytes of the positions a token at ``position`` attends to (what a position-aware
        kernel would read): ``0..position``, the last ``window`` of them in a sliding layer."""
        if not self.read:
            return 0
        if not self.positions:
            return self.bytes
        seen = min(position + 1, self.positions)
        if self.window:
            seen = min(seen, self.window)
        return self.bytes_per_position * seen

    def read_over(self, context: int, windowed: bool) -> int:
        """Bytes a static-shape graph reads from this cache per token when it holds ``context``
        positions, or, ``windowed`` and sliding, only its window (a ring of the window)."""
        if not self.read:
            return 0
        positions = min(self.window, context) if windowed and self.window else context
        return self.bytes_per_position * positions


class SlidingWindow(Contract):
    """What sliding-window layers (Gemma 3) change in the bytes a token moves.

    A sliding layer attends to its last ``window`` positions only. A cache of the whole context
    (the plain layout) is still read whole by the static-shape graph, masked; a ring of the
    window (``kv_window``) is read whole too, and is ``context / window`` times smaller. Both
    figures are this build's bytes per token with every KV read counted over the layout's cache
    lengths; weights, KV writes and copies are this build's.
    """

    model_config = ConfigDict(frozen=True)

    window: int
    context: int
    sliding_caches: int  # K and V caches of the sliding layers
    caches: int
    windowed: bool  # this build keeps only the window (kv_window)
    full_context_bytes: int  # per token, every cache holding the whole context
    windowed_bytes: int  # per token, sliding caches holding only their window

    @property
    def saving(self) -> int:
        return self.full_context_bytes - self.windowed_bytes


class RedundantCopy(Contract):
    """A tensor that only copies another one: written once, read again."""

    model_config = ConfigDict(frozen=True)

    kind: str  # tile | repeat_concat | repeat_gather | broadcast | transpose
    op: str
    name: str
    function: str
    shape: list[int]
    dtype: str
    bytes: int
    moved_bytes: int
    source_op: str
    source: str


class TensorRecord(Contract):
    """One tensor the analysis singles out (a tile output)."""

    model_config = ConfigDict(frozen=True)

    name: str
    shape: list[int]
    dtype: str
    bytes: int


class BytesPerToken(Contract):
    model_config = ConfigDict(frozen=True)

    weights: int
    kv_read: int  # the whole cache: what the static-shape graph reads at any position
    kv_write: int
    redundant: int  # pure copies, each counted written and read again
    total: int
    kv_read_per_position: int = 0  # what a position-aware kernel reads per cached position
    kv_positions: int = 0  # the context length of the longest cache


class FunctionOps(Contract):
    model_config = ConfigDict(frozen=True)

    ops_total: int
    non_const_ops: int
    dispatch_ops: int
    op_counts: dict[str, int]


class GraphAnalysis(Contract):
    """What a build's graph costs per decoded token. Defaults keep first-cut reports loadable."""

    model_config = ConfigDict(frozen=True)

    analysis_version: int = 1
    functions: list[str]
    decode_function: str = ""
    function_ops: dict[str, FunctionOps] = {}
    ops_total: int
    non_const_ops: int
    dispatch_ops: int = 0
    op_counts: dict[str, int]
    unknown_ops: dict[str, int] = {}
    tile_ops: int
    tile_output_bytes: int
    tiles: list[TensorRecord]
    redundant_ops: list[RedundantCopy] = []
    redundant_output_bytes: int = 0
    slice_update_ops: int
    state_write_ops: int
    state_write_bytes: int = 0
    state_read_ops: int
    weight_bytes: int
    weight_file_bytes: int
    weight_bytes_by_encoding: dict[str, int] = {}
    weight_bytes_by_dtype: dict[str, int] = {}
    kv_source: str = "states"
    state_bytes: int
    states: list[KvState]
    bytes_per_token: BytesPerToken
    sliding_window: SlidingWindow | None = None

    @model_validator(mode="before")
    @classmethod
    def _first_cut_dispatch_ops(cls, data: Any) -> Any:
        if isinstance(data, dict) and "dispatch_ops" not in data and "non_const_ops" in data:
            data = {**data, "dispatch_ops": data["non_const_ops"]}
        return data

    @model_serializer(mode="wrap")
    def _with_predictions(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        # Serialised with the built-in profiles so `analyze --json` and build.json carry the
        # prediction; the server recomputes it with the current (calibrated) profiles.
        data = handler(self)
        data["predicted_tok_s"] = self.predicted_tok_s()
        return data

    def predicted_tok_s(self, profiles: Iterable[DeviceProfile] | None = None) -> dict[str, float]:
        """Predicted decode tok/s per device class (the built-in profiles by default)."""
        chosen = DEVICE_PROFILES.values() if profiles is None else profiles
        if self.bytes_per_token.total <= 0:
            return {}  # nothing moves: not a decoder this model can describe
        return {profile.device_class: self.predict(profile) for profile in chosen}

    def predict(self, profile: DeviceProfile) -> float:
        """Predicted decode tok/s on one device class."""
        return profile.predicted_tok_s(self.bytes_per_token.total, self.dispatch_ops)

    def predicted_layouts(
        self, profiles: Iterable[DeviceProfile] | None = None
    ) -> dict[str, tuple[float, float]]:
        """Predicted tok/s per device class with full-context caches and with windowed ones
        (empty without sliding layers)."""
        sliding = self.sliding_window
        if sliding is None:
            return {}
        chosen = DEVICE_PROFILES.values() if profiles is None else profiles
        return {
            profile.device_class: (
                profile.predicted_tok_s(sliding.full_context_bytes, self.dispatch_ops),
                profile.predicted_tok_s(sliding.windowed_bytes, self.dispatch_ops),
            )
            for profile in chosen
        }

    def kv_read_at(self, position: int) -> int:
        """KV bytes a kernel reading only positions ``0..position`` would move."""
        return sum(state.read_at(position) for state in self.states)
