"""Bringing a model to a server: each file through a resumable upload session, then one
registration that the server checks (``decodebench model upload``).

What can be uploaded: a Hugging Face folder (``config.json``, ``*.safetensors`` and the tokenizer
files; anything else in it is left out and listed), one ``.gguf`` file, or a ``.mlpackage`` (a
folder, zipped here with fixed timestamps, or already a ``.zip``). The same header checks the
server runs are run here first, so a corrupt file is refused before a byte is sent.

Resuming: the id of each file's upload session is remembered per (server, file sha256) in a
small JSON file (``~/.cache/decodebench/uploads.json`` unless ``DECODEBENCH_UPLOAD_STATE`` names
another). Run the same command again after an interruption and each file continues from the
offset the server reports; a transport error mid-file is retried from that offset at once.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from decodebench.checkpoints import check_gguf
from decodebench.client import ApiError, DecodebenchClient, file_sha256
from decodebench.contracts.uploads import ModelView
from decodebench.modelfiles import (
    TOKENIZER_FILES,
    ModelFileError,
    check_hf_checkpoint,
)

STATE_ENV = "DECODEBENCH_UPLOAD_STATE"
DEFAULT_CHUNK_BYTES = 8 * 2**20
Progress = Callable[[str, int, int], None]


class UploadError(RuntimeError):
    """The upload cannot go on; the message says why (and whether running again resumes)."""


def state_path() -> Path:
    configured = os.environ.get(STATE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "decodebench" / "uploads.json"


class ResumeState:
    """(server, sha256) -> upload id, written atomically after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError):
            loaded = {}
        self._ids: dict[str, str] = loaded if isinstance(loaded, dict) else {}

    def get(self, key: str) -> str | None:
        return self._ids.get(key)

    def set(self, key: str, upload_id: str | None) -> None:
        if upload_id is None:
            self._ids.pop(key, None)
        else:
            self._ids[key] = upload_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(self._ids, indent=1))
        os.replace(partial, self.path)


def model_files(source: Path, scratch: Path) -> tuple[dict[str, Path], list[str]]:
    """The files to upload (name -> local path) and the names left out of a folder."""
    if source.is_dir() and source.suffix == ".mlpackage":
        from decodebench.artifacts import pack_directory

        archive = pack_directory(source, scratch / f"{source.name}.zip")
        return {archive.name: archive}, []
    if source.is_file():
        if source.suffix not in (".gguf", ".zip"):
            raise ModelFileError(f"{source}: a single file must be a .gguf or a zipped .mlpackage")
        return {source.name: source}, []
    if not source.is_dir():
        raise ModelFileError(f"{source}: no such file or folder")
    chosen: dict[str, Path] = {}
    left_out: list[str] = []
    for path in sorted(source.iterdir()):
        wanted = path.name == "config.json" or path.suffix == ".safetensors"
        if path.is_file() and (wanted or path.name in TOKENIZER_FILES):
            chosen[path.name] = path
        else:
            left_out.append(path.name)
    if "config.json" not in chosen:
        raise ModelFileError(f"{source}: no config.json (a Hugging Face folder needs one)")
    return chosen, left_out


def check_locally(files: dict[str, Path]) -> None:
    """The server's header checks, run before uploading."""
    if "config.json" in files:
        streams = {
            name: (path.open("rb"), path.stat().st_size)
            for name, path in files.items()
            if name.endswith(".safetensors")
        }
        try:
            check_hf_checkpoint(files["config.json"].read_bytes(), streams)
        finally:
            for stream, _ in streams.values():
                stream.close()
    for name, path in files.items():
        if name.endswith(".gguf"):
            with path.open("rb") as stream:
                check_gguf(stream, path.stat().st_size, name)


def upload_file(
    client: DecodebenchClient,
    path: Path,
    sha256: str,
    state: ResumeState,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Progress | None = None,
    retries: int = 5,
) -> int:
    """Send one file, resuming a known session; returns the offset it resumed from."""
    size = path.stat().st_size
    key = f"{client.base_url}|{sha256}"
    upload = None
    known = state.get(key)
    if known is not None:
        try:
            upload = client.get_upload(known)
        except ApiError as error:
            if error.status_code != 404:
                raise
    if upload is None or upload.size != size:
        upload = client.create_upload(path.name, size)
        state.set(key, upload.id)
    if upload.state == "finished":
        return size
    resumed_from = offset = upload.offset
    failures = 0
    with path.open("rb") as stream:
        while offset < size:
            stream.seek(offset)
            data = stream.read(chunk_bytes)
            try:
                offset = client.put_upload_chunk(upload.id, offset, data).offset
                failures = 0
            except (httpx.TransportError, ApiError) as error:
                if isinstance(error, ApiError) and error.status_code != 409:
                    raise
                failures += 1
                if failures > retries:
                    raise UploadError(
                        f"{path.name}: upload interrupted at byte {offset} ({error}); run the "
                        "same command again to resume"
                    ) from None
                time.sleep(min(0.2 * 2**failures, 5.0))
                offset = client.get_upload(upload.id).offset
            if progress is not None:
                progress(path.name, offset, size)
    try:
        client.finish_upload(upload.id, sha256)
    except ApiError as error:
        if error.status_code == 422:  # the server reset it: start afresh next time
            state.set(key, None)
        raise
    return resumed_from


def upload_model(
    client: DecodebenchClient,
    source: Path,
    name: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    state: ResumeState | None = None,
) -> ModelView:
    say = log or (lambda _message: None)
    state = state or ResumeState(state_path())
    with tempfile.TemporaryDirectory(prefix="decodebench-upload-") as scratch:
        files, left_out = model_files(source, Path(scratch))
        if left_out:
            say(f"left out (not part of a checkpoint): {', '.join(left_out)}")
        check_locally(files)
        refs = []
        for file_name, path in sorted(files.items()):
            sha256 = file_sha256(path)
            resumed = upload_file(client, path, sha256, state, chunk_bytes, progress)
            if resumed == path.stat().st_size:
                say(f"{file_name}: already uploaded")
            elif resumed:
                say(f"{file_name}: resumed at byte {resumed}")
            refs.append({"path": file_name, "sha256": sha256})
    return client.register_model({"name": name, "files": refs})
