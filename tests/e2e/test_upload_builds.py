"""A model brought by a user, end to end against a real server process: an upload interrupted
three times (the client killed, a chunk cut mid-stream, the server killed) and resumed by the CLI; a sweep of that model
built by the worker code over HTTP; the built package uploaded again as a user's own package,
folded and verified by the worker, and run to the end on simulated devices by an agent."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from decodebench.cli import main
from decodebench.client import DecodebenchClient, file_sha256
from decodebench.commands.submit import wait_for_sweep
from decodebench.contracts.uploads import upload_identity
from decodebench.uploading import ResumeState, upload_model
from scripts.stack import Stack

pytestmark = pytest.mark.slow
DEVICES = ["iphone-16-pro", "iphone-17-pro"]


class Killed(Exception):
    """The uploading client dies (its process would be gone; its resume state stays)."""


def build_queued(stack: Stack, work_dir: Path, build_id: int) -> str:
    """What a worker does with a queued build, in this process, talking HTTP to the server."""
    from worker.builds import run_build
    from worker.config import WorkerSettings

    settings = WorkerSettings(
        server_url=stack.server_url, worker_token=stack.tokens["worker"], work_dir=work_dir
    )
    return run_build(build_id, settings)


def interrupted_then_resumed(stack: Stack, folder: Path, state: Path, capsys) -> None:
    sent: list[int] = []

    def die_after_a_chunk(name: str, offset: int, size: int) -> None:
        sent.append(offset)
        if name == "model.safetensors":
            raise Killed

    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        with pytest.raises(Killed):
            upload_model(
                client, folder, "tiny", chunk_bytes=1 << 16,
                progress=die_after_a_chunk, state=ResumeState(state),
            )  # fmt: skip
        upload_id = next(
            value for key, value in ResumeState(state)._ids.items()
            if key.endswith(file_sha256(folder / "model.safetensors"))
        )  # fmt: skip
        reached = client.get_upload(upload_id).offset
        assert reached == 1 << 16

        # A chunk cut off mid-stream: the bytes that arrived count, the client resumes after them.
        data = (folder / "model.safetensors").read_bytes()

        def cut_short():
            yield data[reached : reached + 20_000]
            time.sleep(1.0)  # the server has read and written these bytes meanwhile
            raise ConnectionResetError("cable pulled")

        with pytest.raises((httpx.HTTPError, ConnectionResetError)):
            httpx.put(
                f"{stack.server_url}/api/v1/uploads/{upload_id}",
                params={"offset": reached},
                content=cut_short(),
                headers={"Authorization": f"Bearer {stack.tokens['user']}"},
            )
        deadline = time.monotonic() + 10
        while client.get_upload(upload_id).offset == reached and time.monotonic() < deadline:
            time.sleep(0.1)
        resumed_at = client.get_upload(upload_id).offset
        assert resumed_at == reached + 20_000

    # The server killed outright (kill -9) and started again: the offset is still the bytes on disk.
    server = stack.processes["server"]
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=10)
    stack.start_server()

    capsys.readouterr()
    code = main(["model", "upload", str(folder), "--name", "tiny", "--server", stack.server_url,
                 "--token", stack.tokens["user"]])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"model.safetensors: resumed at byte {resumed_at}" in err
    assert "config.json: already uploaded" in err
    assert out.startswith("tiny: hf, LlamaForCausalLM")


def test_uploaded_model_and_package_build_and_run(
    stack: Stack, tiny_llama_folder, tiny_gguf, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("DECODEBENCH_UPLOAD_STATE", str(tmp_path / "uploads.json"))
    interrupted_then_resumed(stack, tiny_llama_folder, tmp_path / "uploads.json", capsys)
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        model = client.get_model("tiny")
        stored = {entry.path: entry.sha256 for entry in model.files}
        for path in tiny_llama_folder.iterdir():
            assert stored[path.name] == hashlib.sha256(path.read_bytes()).hexdigest()

        # A sweep of the uploaded model: the worker fetches its files and builds from them.
        sweep = client.submit_sweep({
            "model": "upload:tiny", "variants": [{"attention": "repeat_kv", "context": 128}],
            "devices": DEVICES[:1], "prompts": 2, "decode_tokens": 8,
        })  # fmt: skip
        (build,) = sweep.builds
        assert build_queued(stack, tmp_path / "worker", build.id).startswith("built ")
        built = client.get_build(build.id)
        assert built.state == "succeeded"
        report = built.report
        assert report is not None
        assert report.model_identity == upload_identity("upload:tiny", model.content_sha256)
        assert report.config.vocab_size == 512 and report.analysis.tile_ops == 4

        # A GGUF checkpoint: the worker dequantizes it into a Hugging Face folder, then builds.
        capsys.readouterr()
        assert main(["model", "upload", str(tiny_gguf), "--name", "tiny-q", "--server",
                     stack.server_url, "--token", stack.tokens["user"]]) == 0  # fmt: skip
        assert capsys.readouterr().out.startswith("tiny-q: gguf, llama")
        (quantized,) = client.submit_sweep({
            "model": "upload:tiny-q", "variants": [{"attention": "folded", "context": 128}],
            "devices": DEVICES[:1], "prompts": 2, "decode_tokens": 8,
        }).builds  # fmt: skip
        assert build_queued(stack, tmp_path / "worker", quantized.id).startswith("built ")
        dequantized = client.get_build(quantized.id).report
        assert dequantized is not None and dequantized.config.vocab_size == 40

        # Its package, uploaded as a user's own: run as built, and folded (verified).
        archive = client.download_artifact(built.artifact_sha256 or "", tmp_path / "built.zip")
        from decodebench.archives import unpack_package

        package = unpack_package(archive, tmp_path / "built", archive.name)
        capsys.readouterr()
        assert main(["model", "upload", str(package), "--name", "mine", "--server",
                     stack.server_url, "--token", stack.tokens["user"]]) == 0  # fmt: skip
        assert "mine: coreml package" in capsys.readouterr().out
        submitted = client.submit_sweep({
            "model": "upload:tiny",
            "variants": [{"package": "mine", "context": 128},
                         {"package": "mine", "fold": True, "context": 128}],
            "devices": DEVICES, "prompts": 3, "decode_tokens": 8,
        })  # fmt: skip
        for queued in submitted.builds:
            assert build_queued(stack, tmp_path / "worker", queued.id).startswith("built ")
        stack.start_agent(DEVICES)
        done = wait_for_sweep(client, submitted.id, timeout_s=300)
    stack.check_alive()
    assert done.state == "completed", done
    as_built, folded = (b.analysis for b in done.builds)
    assert as_built is not None and folded is not None
    assert as_built.tile_ops == 4 and folded.tile_ops == 0
    rows = {(row.device_class, row.variant): row for row in done.results}
    for device_class in DEVICES:
        slow, fast = rows[(device_class, "mine-ctx128")], rows[(device_class, "mine-fold-ctx128")]
        assert slow.prompts_measured == fast.prompts_measured == 3
        assert slow.simulated and fast.simulated
