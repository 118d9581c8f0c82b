"""One model in both formats, end to end with real processes: the server, a build worker, an
agent with an emulated iPhone and one with a simulated one.

The Core ML and the Core AI variant of tiny-gqa are built by the worker (coremltools, and
coreai-torch through the format seam), pushed to the emulated phone as an .mlpackage and as an
.aimodel, timed on both device classes, and shown side by side on the sweep page, in the status
table and in the gate's verdicts. The emulated Core AI run's token ids are the pushed asset's:
what the project's Core AI engine decodes from the downloaded artifact for the same prompts.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from agent.artifacts import unpack_mlpackage
from decodebench.building.agreement import EngineDecoder
from decodebench.cli import main
from decodebench.client import DecodebenchClient
from decodebench.commands.submit import wait_for_sweep
from decodebench.contracts.presets import get_preset
from decodebench.formats.coreai.session import open_session
from decodebench.judging.gate import gate, render_markdown
from decodebench.prompts import pseudo_tokenize
from scripts.stack import Stack
from tests.support.lab import query
from tests.support.pages import ui_sign_in

pytestmark = pytest.mark.slow

CONTEXT, DECODE = 64, 4
TEXTS = ["Why is the sky blue?", "Name three prime numbers and say why."]
SPEC = {
    "model": "tiny-gqa",
    "variants": [
        {"format": "coreml", "context": CONTEXT},
        {"format": "coreai", "context": CONTEXT},
    ],
    "devices": ["iphone-17-pro", "iphone-16-pro"],
    "prompt_texts": TEXTS,
    "decode_tokens": DECODE,
}
COREML, COREAI = "folded-ctx64-fp16", "coreai-folded-ctx64-fp16"
EMULATED, SIMULATED = "iphone-17-pro", "iphone-16-pro"


def _token_ids(sweep: dict, device_class: str, variant: str) -> list[list[int] | None]:
    run = next(
        run
        for run in sweep["runs"]
        if run["device_class"] == device_class and run["variant"] == variant
    )
    rows = query(
        "SELECT token_ids FROM prompt_results WHERE run_id = :id ORDER BY prompt_index",
        id=run["id"],
    )
    return [row.token_ids for row in rows]


def _engine_tokens(client: DecodebenchClient, sha256: str, tmp_path: Path) -> list[list[int]]:
    """What the Core AI engine decodes from the artifact itself, for the job's prompts."""
    artifact = client.download_artifact(sha256, tmp_path / f"{sha256}.zip")
    asset = unpack_mlpackage(artifact, tmp_path / "asset")
    assert asset.name == "model.aimodel"
    decoder = EngineDecoder(open_session(asset))
    vocab = get_preset("tiny-gqa").vocab_size
    prompts = [pseudo_tokenize(text, vocab)[-(CONTEXT - DECODE) :] for text in TEXTS]
    return [decoder.greedy(prompt, DECODE) for prompt in prompts]


def _sweep_page(stack: Stack, sweep_id: int) -> str:
    with httpx.Client(base_url=stack.server_url) as browser:
        assert ui_sign_in(browser, stack.tokens["user"]).status_code == 303
        page = browser.get(f"/sweeps/{sweep_id}/live")
        assert page.status_code == 200, page.text
        return page.text


def test_a_sweep_of_both_formats_runs_on_emulated_and_simulated_phones(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.start_worker()
    stack.start_agent([EMULATED], "--driver", "emulated", "--emulated-tokens", "auto",
                      "--poll-interval", "0.2", name="emulated")  # fmt: skip
    stack.start_agent([SIMULATED], "--poll-interval", "0.2", name="simulated")
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        submitted = client.submit_sweep(SPEC)
        sweep = wait_for_sweep(client, submitted.id, timeout_s=400).model_dump(mode="json")
        stack.check_alive()
        assert sweep["state"] == "completed", sweep
        builds = {build["label"]: build for build in sweep["builds"]}
        packages = {label: client.get_build(build["id"]).report for label, build in builds.items()}
        assert {label: report.package for label, report in packages.items() if report} == {
            COREML: "model.mlpackage",
            COREAI: "model.aimodel",
        }
        expected = _engine_tokens(client, builds[COREAI]["artifact_sha256"], tmp_path)
        verdicts = client.get_verdicts(submitted.id).verdicts

    rows = {(row["device_class"], row["variant"]): row for row in sweep["results"]}
    for device_class in SPEC["devices"]:
        for label, format_name in ((COREML, "coreml"), (COREAI, "coreai")):
            row = rows[(device_class, label)]
            assert (row["format"], row["prompts_measured"], row["simulated"]) == (
                format_name, 2, True
            )  # fmt: skip
            assert row["load_time_cold_ms"] > row["load_time_warm_ms"] > 0
    drivers = {(run["device_class"], run["variant"]): run["driver"] for run in sweep["runs"]}
    assert set(drivers.values()) == {"emulated", "simulated"}
    assert all(drivers[(EMULATED, label)] == "emulated" for label in (COREML, COREAI))
    # The emulated phone decoded what it was pushed; the simulated one knows no tokens.
    assert _token_ids(sweep, EMULATED, COREAI) == expected
    timing = {(run["device_class"], run["variant"]): run["summary"]["timing_model"]
              for run in sweep["runs"]}  # fmt: skip
    assert (
        "tokens from the pushed .aimodel run by the project's Core AI engine"
        in (timing[(EMULATED, COREAI)])
    )
    assert "the pushed package run by the MIL reference interpreter" in timing[(EMULATED, COREML)]
    assert "(coreai package)" in timing[(SIMULATED, COREAI)]
    assert all(
        ids is not None and len(ids) == DECODE for ids in _token_ids(sweep, EMULATED, COREML)
    )
    assert _token_ids(sweep, SIMULATED, COREAI) == [None, None]

    page = _sweep_page(stack, submitted.id)
    table = page[page.index('id="comparison"') : page.index("</table>")]
    assert table.count('data-format="coreai">Core AI<') == 2
    assert table.count('data-format="coreml">Core ML<') == 2
    assert len(re.findall(r'class="load">\d+ \(specialization\) / \d+<', table)) == 2

    assert main(["status", "--server", stack.server_url, "--token", stack.tokens["user"],
                 str(submitted.id)]) == 0  # fmt: skip
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iphone")]
    assert [line.split()[:3] for line in printed] == [
        [EMULATED, COREML, "Core"], [EMULATED, COREAI, "Core"],
        [SIMULATED, COREML, "Core"], [SIMULATED, COREAI, "Core"],
    ]  # fmt: skip
    assert all(" Core AI " in line and "(specialization)" in line for line in printed[1::2])
    assert all(" Core ML " in line and "(specialization)" not in line for line in printed[::2])

    markdown = render_markdown(gate(verdicts, fail_on_regression=False))
    assert markdown.count(f"| {COREAI} vs {COREML} |") == 2
