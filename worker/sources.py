"""What a build is made from when a user brought it: the files of an uploaded checkpoint or
package, fetched from the server's artifact store over HTTP (each checked against its sha256)
into the worker's model cache, ``<work_dir>/models/<content sha256>/``.

A cache entry is written in a private folder and renamed into place, so it is complete or
absent; a GGUF checkpoint is dequantized once into a Hugging Face folder beside it (``hf/``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from decodebench.client import DecodebenchClient
from decodebench.contracts.presets import ModelConfig, get_preset
from decodebench.contracts.uploads import UPLOAD_PREFIX, ModelKind, ModelView, upload_identity
from decodebench.contracts.workers import BuildAssignment
from decodebench.modelfiles import content_sha256


class SourceError(RuntimeError):
    """The uploaded model cannot be used as the server describes it."""


@dataclass(frozen=True)
class BuildSources:
    identity: str  # what the build key hashes (decodebench.contracts.uploads.upload_identity)
    weights: Path | None  # a Hugging Face folder, for an uploaded checkpoint
    weights_fingerprint: str | None
    package: Path | None  # the zipped .mlpackage, for a package variant


def fetch_sources(
    client: DecodebenchClient, assignment: BuildAssignment, root: Path
) -> BuildSources:
    weights = model = None
    if assignment.model.startswith(UPLOAD_PREFIX):
        model = client.get_model(assignment.model.removeprefix(UPLOAD_PREFIX))
        folder = fetch_files(client, model, root)
        weights = _hf_folder(model, folder)
    package = package_view = None
    if assignment.variant.package is not None:
        package_view = client.get_model(assignment.variant.package)
        if package_view.kind != ModelKind.mlpackage:
            raise SourceError(f"package: {package_view.name} is not a .mlpackage")
        package = fetch_files(client, package_view, root) / package_view.files[0].path
    identity = upload_identity(
        assignment.model,
        model.content_sha256 if model is not None else None,
        package_view.content_sha256 if package_view is not None else None,
    )
    return BuildSources(
        identity=identity,
        weights=weights,
        weights_fingerprint=model.content_sha256 if model is not None else None,
        package=package,
    )


def fetch_files(client: DecodebenchClient, model: ModelView, root: Path) -> Path:
    """The model's files in one folder, downloaded once and checked against every hash."""
    listed = content_sha256((entry.path, entry.sha256) for entry in model.files)
    if listed != model.content_sha256:
        raise SourceError(
            f"model {model.name}: its files hash to {listed}, not its content {model.content_sha256}"
        )
    folder = root / model.content_sha256
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetching-") as scratch:
        staging = Path(scratch) / "files"
        staging.mkdir()
        for entry in model.files:
            client.download_artifact(entry.sha256, staging / entry.path)
        try:
            os.replace(staging, folder)
        except OSError:  # another build fetched it meanwhile
            if not folder.is_dir():
                raise
    return folder


def _hf_folder(model: ModelView, folder: Path) -> Path:
    if model.kind == ModelKind.hf:
        return folder
    if model.kind != ModelKind.gguf:
        raise SourceError(f"model {model.name} is a {model.kind.value}, not a checkpoint")
    from decodebench.building.realmodels import write_hf_folder

    converted = folder / "hf"
    if not (converted / "config.json").is_file():
        staging = folder / ".hf-partial"
        shutil.rmtree(staging, ignore_errors=True)
        write_hf_folder(folder / model.files[0].path, staging)
        os.replace(staging, converted)
    return converted


def model_config(model: str, weights: Path | None) -> ModelConfig:
    """The decoder's config of the sweep's model: a preset's, or the uploaded config.json's."""
    if weights is None:
        return get_preset(model)
    import json

    from decodebench.building.weights import model_config_from_hf

    raw = json.loads((weights / "config.json").read_text())
    return model_config_from_hf(raw, name=model.removeprefix(UPLOAD_PREFIX))
