"""What a checkpoint's headers say, read without torch or the safetensors library.

A safetensors file's header (every tensor's dtype, shape and byte range, checked against the
file), a GGUF file's header (its ``general.architecture`` and the keys transformers' GGUF loader
would misread), and which tensor names a checkpoint may carry that the decoder does not use.
The server checks uploads with these (:mod:`decodebench.modelfiles`) and the builder loads
checkpoints by the same names (:mod:`decodebench.building.weights`). Every refusal is a
:class:`ModelFileError` naming the file and, for a safetensors file, the tensor at fault.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any, BinaryIO

# Bytes per element of each safetensors dtype.
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own bound
# What transformers' GGUF loader (integrations/ggml.py) dequantizes into one of our families.
GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "phi3", "gemma3"})
# Our families whose llama.cpp architecture transformers' GGUF loader does not map.
GGUF_UNLOADABLE = {"smollm3": "SmolLM3", "exaone4": "EXAONE 4"}
# Qwen3's head_dim as transformers' GGUF loader reads it: its config default (key_length unread).
QWEN3_GGUF_HEAD_DIM = 128
# Tensors a checkpoint may carry that the decoder does not use (precomputed rotary tables).
_UNUSED_TENSOR = re.compile(r"(rotary_emb\.inv_freq|\.rotary_emb\.)")


class ModelFileError(ValueError):
    """A file of an uploaded model is refused; the message names the file (and tensor)."""


def is_unused_tensor(name: str) -> bool:
    """Whether a checkpoint's tensor is one the decoder has no use for (and may be skipped)."""
    return _UNUSED_TENSOR.search(name) is not None


# -- safetensors ------------------------------------------------------------------------------


def read_safetensors_header(stream: BinaryIO, size: int, name: str) -> dict[str, dict[str, Any]]:
    """The tensors of a safetensors file (name -> dtype, shape, data_offsets), every entry
    checked: a known dtype, a shape of non-negative integers, a byte range that holds exactly
    that shape and lies inside the file, ranges that tile the data without gaps or overlaps."""
    if size < 8:
        raise ModelFileError(f"{name}: {size} bytes, too short for a safetensors header")
    (header_bytes,) = struct.unpack("<Q", stream.read(8))
    if header_bytes > min(MAX_HEADER_BYTES, size - 8):
        raise ModelFileError(
            f"{name}: header length {header_bytes} exceeds the file ({size} bytes) or "
            f"{MAX_HEADER_BYTES} bytes; not a safetensors file, or truncated"
        )
    try:
        header = json.loads(stream.read(header_bytes))
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ModelFileError(f"{name}: the header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{name}: the header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - header_bytes
    tensors: dict[str, dict[str, Any]] = {}
    for tensor, entry in header.items():
        tensors[tensor] = _tensor_entry(name, tensor, entry, data_bytes)
    position = 0
    for tensor, entry in sorted(tensors.items(), key=lambda item: item[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else "leaves a gap"
            raise ModelFileError(
                f"{name}: tensor {tensor}: data starts at byte {begin} and {what} (expected {position})"
            )
        position = end
    if position != data_bytes:
        raise ModelFileError(
            f"{name}: the tensors cover {position} data bytes but the file holds {data_bytes}"
        )
    return tensors


def _tensor_entry(name: str, tensor: str, entry: object, data_bytes: int) -> dict[str, Any]:
    where = f"{name}: tensor {tensor}"
    if not isinstance(entry, dict):
        raise ModelFileError(f"{where}: its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise ModelFileError(f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape
    ):
        raise ModelFileError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(value, int) and not isinstance(value, bool) for value in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise ModelFileError(f"{where}: data_offsets {offsets!r} are not [begin, end] bytes")
    if offsets[1] > data_bytes:
        raise ModelFileError(
            f"{where}: its data ends at byte {offsets[1]} but the file holds only {data_bytes} "
            "data bytes (truncated?)"
        )
    needed = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
    if offsets[1] - offsets[0] != needed:
        raise ModelFileError(
            f"{where}: shape {shape} of {dtype} needs {needed} bytes, its data_offsets hold "
            f"{offsets[1] - offsets[0]}"
        )
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


# -- GGUF -------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Reader:
    def __init__(self, stream: BinaryIO, size: int, name: str) -> None:
        self.stream, self.size, self.name = stream, size, name

    def take(self, count: int) -> bytes:
        if count > self.size - self.stream.tell():
            raise ModelFileError(f"{self.name}: the GGUF header runs past the end of the file")
        return self.stream.read(count)

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("<Q"))
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ModelFileError(f"{self.name}: a GGUF string is not UTF-8") from None

    def value(self, kind: int) -> Any:
        if kind in _GGUF_SCALARS:
            return self.unpack(_GGUF_SCALARS[kind])
        if kind == _GGUF_STRING:
            return self.string()
        if kind == _GGUF_ARRAY:
            item_kind, count = self.unpack("<I"), self.unpack("<Q")
            if item_kind in _GGUF_SCALARS:  # skipped without reading item by item
                self.take(count * struct.calcsize(_GGUF_SCALARS[item_kind]))
                return None
            if item_kind != _GGUF_STRING:
                raise ModelFileError(f"{self.name}: GGUF array of unsupported type {item_kind}")
            for _ in range(count):
                self.take(self.unpack("<Q"))
            return None
        raise ModelFileError(f"{self.name}: unknown GGUF value type {kind}")


def check_gguf(stream: BinaryIO, size: int, name: str) -> dict:
    """The header of a GGUF file: magic, version, and ``general.architecture`` (supported)."""
    reader = _Reader(stream, size, name)
    if reader.take(4) != b"GGUF":
        raise ModelFileError(f"{name}: not a GGUF file (no GGUF magic)")
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise ModelFileError(f"{name}: GGUF version {version} is not supported (2, 3)")
    tensor_count, kv_count = reader.unpack("<Q"), reader.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(reader.unpack("<I"))
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ModelFileError(f"{name}: no general.architecture in the GGUF metadata")
    supported = ", ".join(sorted(GGUF_ARCHITECTURES))
    if architecture in GGUF_UNLOADABLE:
        raise ModelFileError(
            f"{name}: general.architecture {architecture!r} is not supported: transformers' GGUF "
            f"loader does not map {GGUF_UNLOADABLE[architecture]}, so it cannot be dequantized "
            f"(upload its Hugging Face folder instead); supported: {supported}"
        )
    if architecture not in GGUF_ARCHITECTURES:
        raise ModelFileError(
            f"{name}: general.architecture {architecture!r} is not supported; "
            f"supported: {supported}"
        )
    _check_gguf_family(metadata, architecture, name)
    return {"architecture": architecture, "gguf_version": version, "tensors": tensor_count}


def _check_gguf_family(metadata: dict[str, Any], architecture: str, name: str) -> None:
    """Refuse what transformers' GGUF loader would read as a different model than the file's:
    it leaves these keys unread and falls back to its config defaults."""
    unread = "transformers' GGUF loader does not read it"
    if architecture == "qwen3":
        key_length = metadata.get("qwen3.attention.key_length")
        if key_length is not None and key_length != QWEN3_GGUF_HEAD_DIM:
            raise ModelFileError(
                f"{name}: qwen3.attention.key_length={key_length} is not supported: {unread} "
                f"and takes head_dim {QWEN3_GGUF_HEAD_DIM}"
            )
    if architecture == "phi3":
        scaling = sorted(key for key in metadata if key.startswith("phi3.rope.scaling."))
        if scaling:
            raise ModelFileError(f"{name}: {scaling[0]} (LongRoPE) is not supported: {unread}")
        rotated = metadata.get("phi3.rope.dimension_count")
        hidden, heads = (
            metadata.get("phi3.embedding_length"),
            metadata.get("phi3.attention.head_count"),
        )
        if rotated is not None and isinstance(hidden, int) and isinstance(heads, int) and heads:
            if rotated != hidden // heads:
                raise ModelFileError(
                    f"{name}: phi3.rope.dimension_count={rotated} of head_dim {hidden // heads} "
                    f"(partial rotary) is not supported: {unread}"
                )
