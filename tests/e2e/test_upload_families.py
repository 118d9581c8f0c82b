"""An uploaded Qwen3 checkpoint (made by transformers' own classes), end to end with real
processes: the CLI uploads it to a server process (a misshapen copy refused first, naming the
tensor), a sweep of ``upload:<name>`` is built by a Celery worker process and run to the end by
an agent process on simulated devices."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from decodebench.cli import main
from decodebench.client import DecodebenchClient
from decodebench.commands.submit import wait_for_sweep
from decodebench.contracts.uploads import upload_identity
from scripts.stack import Stack
from tests.support.families import QWEN3_FIELDS, qwen3_checkpoint

pytestmark = pytest.mark.slow
DEVICE = "iphone-17-pro"
LAYERS = QWEN3_FIELDS["num_hidden_layers"]


def _misshapen(folder: Path, into: Path) -> str:
    """A copy whose first q_norm has one weight too many; returns that tensor's name."""
    shutil.copytree(folder, into)
    tensors = load_file(into / "model.safetensors")
    name = "model.layers.0.self_attn.q_norm.weight"
    tensors[name] = torch.ones(QWEN3_FIELDS["head_dim"] + 1)
    save_file(tensors, into / "model.safetensors")
    return name


def _upload(stack: Stack, source: Path, name: str, capsys: pytest.CaptureFixture[str]):
    capsys.readouterr()
    code = main(["model", "upload", str(source), "--name", name, "--server", stack.server_url,
                 "--token", stack.tokens["user"]])  # fmt: skip
    return code, *capsys.readouterr()


def test_uploaded_qwen3_is_built_and_run_by_a_sweep(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("DECODEBENCH_UPLOAD_STATE", str(tmp_path / "uploads.json"))
    stack.start_worker()
    folder = qwen3_checkpoint(tmp_path / "tiny-qwen3")

    tensor = _misshapen(folder, tmp_path / "bad-qwen3")
    code, _, err = _upload(stack, tmp_path / "bad-qwen3", "bad-qwen3", capsys)
    assert code == 2 and f"tensor {tensor}: shape (33,), expected (32,)" in err

    code, out, err = _upload(stack, folder, "qwen3-tiny", capsys)
    assert code == 0, err
    assert out.startswith("qwen3-tiny: hf, Qwen3ForCausalLM")
    stack.start_agent([DEVICE])
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        model = client.get_model("qwen3-tiny")
        submitted = client.submit_sweep({
            "model": "upload:qwen3-tiny",
            "variants": [{"attention": "repeat_kv", "context": 128},
                         {"attention": "folded", "context": 128}],
            "devices": [DEVICE], "prompts": 2, "decode_tokens": 8,
        })  # fmt: skip
        done = wait_for_sweep(client, submitted.id, timeout_s=120)
        reports = [client.get_build(build.id).report for build in done.builds]
    stack.check_alive()

    assert done.state == "completed", done
    for report in reports:
        assert report is not None
        assert report.model_identity == upload_identity("upload:qwen3-tiny", model.content_sha256)
        assert report.config.family == "qwen3" and report.config.head_dim == 32
    repeat_kv, folded = (build.analysis for build in done.builds)
    assert repeat_kv is not None and folded is not None
    assert repeat_kv.tile_ops == 2 * LAYERS and folded.tile_ops == 0
    rows = {row.variant: row for row in done.results}
    for variant in ("repeat_kv-ctx128-fp16", "folded-ctx128-fp16"):
        assert rows[variant].prompts_measured == 2 and rows[variant].simulated
