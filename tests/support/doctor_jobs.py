"""The package of the doctor job's tests: a small Llama converted as Apple's recipe converts it
(fp16, KV cache as state), whose residual stream carries a massive channel, so its norms
overflow in fp16. Its vocabulary is SmolLM2's, so the job's default tokenizer encodes the chat
prompts for it."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from decodebench.artifacts import pack_directory

SMOLLM2_VOCAB = 49152
CONTEXT = 128


def massive_channel_package(root: Path, vocab_size: int = SMOLLM2_VOCAB) -> Path:
    """Converted once into ``root`` (seconds); the package's path."""
    from decodebench.formats.coreml.recipe import convert_model, tiny_llama_with_massive_channel

    package = root / f"massive-v{vocab_size}.mlpackage"
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{package.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (package / "Manifest.json").is_file():
            model = tiny_llama_with_massive_channel(vocab_size=vocab_size)
            convert_model(model, package, layout="state", context=CONTEXT)
    return package


def massive_channel_checkpoint(root: Path, tokenizer: Path) -> Path:
    """The package's source as a user uploads it: the same seeded transformers model, written by
    ``save_pretrained``, with the tokenizer files of ``tokenizer`` (SmolLM2's folder)."""
    from decodebench.formats.coreml.recipe import tiny_llama_with_massive_channel

    folder = root / "massive-checkpoint"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".massive-checkpoint.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():
            tiny_llama_with_massive_channel(vocab_size=SMOLLM2_VOCAB).save_pretrained(folder)
            for path in [*tokenizer.glob("tokenizer*"), *tokenizer.glob("chat_template*")]:
                shutil.copy(path, folder / path.name)
    return folder


def zipped(package: Path, into: Path) -> Path:
    """The package as a user uploads it: a zip holding ``<name>.mlpackage/``."""
    folder = into / "zip-root"
    if not (folder / package.name).is_dir():
        shutil.copytree(package, folder / package.name)
    return pack_directory(folder, into / f"{package.name}.zip")
