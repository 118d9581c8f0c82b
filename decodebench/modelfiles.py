"""What a user's model files must be, checked from their headers alone (no torch, no coremltools).

The server runs these checks when an uploaded model is registered and the CLI runs them before
it uploads a byte: a Hugging Face checkpoint (``config.json`` naming a supported architecture,
``*.safetensors`` whose headers parse and whose tensors are the ones the decoder needs, with the
shapes and byte ranges they claim), a GGUF file (its header and ``general.architecture``), or a
zipped ``.mlpackage``. The headers are read by :mod:`decodebench.checkpoints`, the zip checked by
:mod:`decodebench.archives`. Every refusal is a :class:`ModelFileError` naming the file and, for
a safetensors file, the tensor at fault.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from decodebench.archives import ArchiveError, read_package_archive
from decodebench.building.weights import WeightsError, expected_shapes, model_config_from_hf
from decodebench.checkpoints import (
    FLOAT_DTYPES,
    ModelFileError,
    is_unused_tensor,
    read_safetensors_header,
)

__all__ = [  # ModelFileError is the checkpoints module's; its users import it from here
    "TOKENIZER_FILES",
    "ModelFileError",
    "check_file_name",
    "check_hf_checkpoint",
    "check_json_file",
    "check_package_zip",
    "content_sha256",
    "detect_kind",
]

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
FILE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def content_sha256(files: Iterable[tuple[str, str]]) -> str:
    """The identity of a set of files: sha256 over ``path:sha256`` lines in path order."""
    digest = hashlib.sha256()
    for path, sha256 in sorted(files):
        digest.update(f"{path}:{sha256}\n".encode())
    return digest.hexdigest()


def detect_kind(paths: list[str]) -> str:
    """``hf`` (a config.json among them), ``gguf`` (one .gguf file) or ``package`` (one zip)."""
    if "config.json" in paths:
        return "hf"
    if len(paths) == 1 and paths[0].endswith(".gguf"):
        return "gguf"
    if len(paths) == 1 and paths[0].endswith(".zip"):
        return "package"
    raise ModelFileError(
        "files: a model is a Hugging Face folder (config.json and *.safetensors), one .gguf "
        f"file, or one zipped .mlpackage; got {', '.join(sorted(paths)) or 'nothing'}"
    )


def check_file_name(path: str) -> None:
    if not FILE_NAME.match(path):
        raise ModelFileError(
            f"file {path!r}: names are 1-128 letters, digits, '.', '_' or '-' (no folders)"
        )


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
            elif is_unused_tensor(tensor) or (
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


# -- zipped .mlpackage ------------------------------------------------------------------------


def check_package_zip(path: Path, name: str, max_unpacked_bytes: int) -> dict:
    """A zip holding one ``.mlpackage`` (or a package's contents at its top), by the rule of
    :mod:`decodebench.archives`: entries that stay inside the extraction folder, one manifest
    where a package keeps it, and at most ``max_unpacked_bytes`` once unpacked."""
    try:
        listing = read_package_archive(path, name, max_unpacked_bytes)
    except ArchiveError as error:
        raise ModelFileError(str(error)) from None
    return {
        "architecture": None,
        "unpacked_bytes": listing.unpacked_bytes,
        "manifest": listing.manifest,
    }
