"""What a user's model files must be, checked from their headers alone (no torch, no coremltools).

The server runs these checks when an uploaded model is registered and the CLI runs them before
it uploads a byte: a Hugging Face checkpoint (``config.json`` naming a supported architecture,
``*.safetensors`` whose headers parse and whose tensors are the ones the decoder needs, with the
shapes and byte ranges they claim), a GGUF file (its header and ``general.architecture``), or a
zipped ``.mlpackage``. Every refusal is a :class:`ModelFileError` naming the file and, for a
safetensors file, the tensor at fault.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from decodebench.building.weights import (
    _IGNORED,
    WeightsError,
    expected_shapes,
    model_config_from_hf,
)

# Bytes per element of each safetensors dtype.
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own bound
# Small files of a checkpoint besides config and weights (read as JSON when named *.json).
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
    }
)
# What transformers' GGUF loader (integrations/ggml.py) dequantizes into one of our families.
GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "phi3", "gemma3"})
# Our families whose llama.cpp architecture transformers' GGUF loader does not map.
GGUF_UNLOADABLE = {"smollm3": "SmolLM3", "exaone4": "EXAONE 4"}
# Qwen3's head_dim as transformers' GGUF loader reads it: its config default (key_length unread).
QWEN3_GGUF_HEAD_DIM = 128
FILE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class ModelFileError(ValueError):
    """A file of an uploaded model is refused; the message names the file (and tensor)."""


def content_sha256(files: Iterable[tuple[str, str]]) -> str:
    """The identity of a set of files: sha256 over ``path:sha256`` lines in path order."""
    digest = hashlib.sha256()
    for path, sha256 in sorted(files):
        digest.update(f"{path}:{sha256}\n".encode())
    return digest.hexdigest()


def detect_kind(paths: list[str]) -> str:
    """``hf`` (a config.json among them), ``gguf`` (one .gguf file) or ``mlpackage`` (one zip)."""
    if "config.json" in paths:
        return "hf"
    if len(paths) == 1 and paths[0].endswith(".gguf"):
        return "gguf"
    if len(paths) == 1 and paths[0].endswith(".zip"):
        return "mlpackage"
    raise ModelFileError(
        "files: a model is a Hugging Face folder (config.json and *.safetensors), one .gguf "
        f"file, or one zipped .mlpackage; got {', '.join(sorted(paths)) or 'nothing'}"
    )


def check_file_name(path: str) -> None:
    if not FILE_NAME.match(path):
        raise ModelFileError(
            f"file {path!r}: names are 1-128 letters, digits, '.', '_' or '-' (no folders)"
        )


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


def check_hf_checkpoint(
    config_text: bytes, safetensors: Mapping[str, tuple[BinaryIO, int]]
) -> dict:
    """Check a Hugging Face checkpoint from its config and its safetensors streams (name ->
    (stream, size)); returns a summary (architecture, the decoder's shape, parameter count)."""
    try:
        raw = json.loads(config_text)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ModelFileError(f"config.json: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ModelFileError("config.json: not a JSON object")
    try:
        config = model_config_from_hf(raw, name="upload")
    except WeightsError as error:
        raise ModelFileError(str(error)) from None
    if not safetensors:
        raise ModelFileError("files: no *.safetensors file")
    expected = expected_shapes(config)
    seen: dict[str, str] = {}
    parameters = 0
    for file_name, (stream, size) in sorted(safetensors.items()):
        for tensor, entry in read_safetensors_header(stream, size, file_name).items():
            where = f"{file_name}: tensor {tensor}"
            if tensor in seen:
                raise ModelFileError(f"{where}: also in {seen[tensor]}")
            seen[tensor] = file_name
            if tensor in expected:
                if tuple(entry["shape"]) != expected[tensor]:
                    raise ModelFileError(
                        f"{where}: shape {tuple(entry['shape'])}, expected {expected[tensor]}"
                    )
                if entry["dtype"] not in FLOAT_DTYPES:
                    raise ModelFileError(f"{where}: dtype {entry['dtype']} is not floating point")
                parameters += math.prod(entry["shape"])
            elif _IGNORED.search(tensor) or (
                tensor == "lm_head.weight" and config.tie_word_embeddings
            ):
                continue
            else:
                raise ModelFileError(f"{where}: unexpected for a {config.family} checkpoint")
    missing = [tensor for tensor in expected if tensor not in seen]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFileError(f"files: tensor {missing[0]} is missing{more}")
    architecture = (raw.get("architectures") or [config.family])[0]
    return {
        "architecture": str(architecture),
        "family": config.family,
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "parameters": parameters,
    }


def check_json_file(name: str, text: bytes) -> None:
    try:
        json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ModelFileError(f"{name}: not JSON ({error})") from None


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


# -- zipped .mlpackage ------------------------------------------------------------------------


def check_package_zip(path: Path, name: str, max_unpacked_bytes: int) -> dict:
    """A zip holding one ``.mlpackage`` (or a package's contents at its top); entries that stay
    inside the extraction folder, and at most ``max_unpacked_bytes`` once unpacked."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelFileError(f"{name}: not a zip archive ({error})") from None
    unpacked = 0
    manifests = []
    for entry in entries:
        member = PurePosixPath(entry.filename)
        if member.is_absolute() or ".." in member.parts or "\\" in entry.filename:
            raise ModelFileError(f"{name}: entry {entry.filename!r} escapes the package folder")
        unpacked += entry.file_size
        if member.name == "Manifest.json" and (
            len(member.parts) == 1
            or (len(member.parts) == 2 and member.parts[0].endswith(".mlpackage"))
        ):
            manifests.append(entry.filename)
    if unpacked > max_unpacked_bytes:
        raise ModelFileError(
            f"{name}: unpacks to {unpacked} bytes, over the limit of {max_unpacked_bytes} "
            "(DECODEBENCH_MAX_MODEL_BYTES)"
        )
    if len(manifests) != 1:
        raise ModelFileError(
            f"{name}: holds {len(manifests)} .mlpackage manifests; expected exactly one "
            "(<name>.mlpackage/Manifest.json, or Manifest.json at the top)"
        )
    return {"architecture": None, "unpacked_bytes": unpacked, "manifest": manifests[0]}
