"""Real prompts through the service: a sweep names SmolLM2 or brings its own prompts, the build
carries the fp32 reference outputs, runs decode the model's own token ids, and the sweep shows
agreement with the reference and the answers as text (the server has no tokenizer)."""

from __future__ import annotations

import hashlib
import json

import pytest

from decodebench.contracts.domain import SweepSpec, VariantSpec
from decodebench.contracts.variants import build_key
from decodebench.detokenize import detokenize, dump_table, load_table
from scripts.standins import MINIMAL_ANALYSIS, build_report
from tests.support.api import bearer, start_and_complete
from tests.support.pages import ui_sign_in
from tests.support.services import table_counts

DEVICE = {
    "udid": "SIM-0001",
    "device_class": "iphone-17-pro",
    "product_type": "iPhone18,1",
    "driver": "simulated",
    "simulated": True,
}
SWEEP = {
    "model": "smollm2-135m",
    "variants": [
        {"attention": "repeat_kv", "context": 256},
        {"attention": "folded", "context": 256},
    ],
    "devices": ["iphone-17-pro"],
    "prompt_texts": ["What is the capital of France?", "Say <hello> & goodbye."],
    "decode_tokens": 3,
}
# A stand-in detokenizer table: id -> bytes, as the worker writes one from the tokenizer.
PIECES = [b"<|im_end|>", b"The", b" capital", b" is", b" Paris", b".", "\N{GRINNING FACE}".encode()]


def test_detokenizer_table_round_trips_and_marks_what_it_cannot_read() -> None:
    table = load_table(dump_table(PIECES))
    assert detokenize(table, [1, 2, 3, 4, 5, 0]) == "The capital is Paris.<|im_end|>"
    assert detokenize(table, [6, 99]) == "\N{GRINNING FACE}\N{REPLACEMENT CHARACTER}"
    emoji = PIECES[6]  # a multi-byte character split over two tokens still reads whole
    assert detokenize([emoji[:2], emoji[2:]], [0, 1]) == "\N{GRINNING FACE}"


@pytest.mark.parametrize(
    "change, named",
    [
        ({"prompt_texts": []}, "prompt_texts"),
        ({"prompt_texts": ["ok"] * 31}, "prompt_texts"),
        ({"prompt_texts": ["x" * 4001]}, '"prompt_texts",0'),
        ({"prompt_texts": ["fine", "bell \x07 here"]}, "U+0007"),
        ({"prompt_texts": ["\x1b[2J"]}, "U+001B"),
        ({"prompt_texts": ["   \n\t"]}, "only white space"),
        ({"prompt_texts": ["a", "b"], "prompts": 3}, "differs from the 2 prompt_texts"),
        ({"model": "smollm2-1.7b"}, "unknown model"),
    ],
)
def test_bad_prompt_sets_are_refused_naming_the_field(api, user_token, change, named) -> None:
    before = table_counts()
    response = api.post("/api/v1/sweeps", json={**SWEEP, **change}, headers=bearer(user_token))
    assert response.status_code == 422, response.text
    assert named in response.text
    assert table_counts() == before


def test_the_prompts_are_part_of_a_tokenizer_models_build_key() -> None:
    spec = SweepSpec.model_validate(SWEEP)
    assert spec.prompts == 2 and spec.prompt_set_version == "custom"
    other = SweepSpec.model_validate({**SWEEP, "prompt_texts": ["Another question?"]})
    longer = SweepSpec.model_validate({**SWEEP, "decode_tokens": 4})
    builtin = SweepSpec.model_validate({k: v for k, v in SWEEP.items() if k != "prompt_texts"})
    assert builtin.prompt_set_version == "chat-v1" and builtin.prompts == 30
    variant, toolchain = VariantSpec(context=256), {"coremltools": "9.0"}
    keys = {
        build_key(spec.model, variant, toolchain, s.reference_identity())
        for s in (spec, other, longer, builtin)
    }
    assert len(keys) == 4
    # A preset has no reference: its keys are the ones it had before prompts were keyed.
    preset = SweepSpec.model_validate({**SWEEP, "model": "tiny-gqa"})
    assert preset.reference_identity() is None and preset.prompt_set_version == "custom"


def _references(request: dict, answers: list[list[int]], table_sha: str) -> dict:
    return {
        "reference": "transformers fp32 greedy",
        "prompt_set": "custom",
        "identity": request["identity"],
        "decode_tokens": request["decode_tokens"],
        "prompts": [
            {
                "index": index,
                "text": text,
                "token_ids": [1, 2, 3, 40 + index],
                "reference_ids": answer,
                "reference_text": detokenize(PIECES, answer),
            }
            for index, (text, answer) in enumerate(zip(request["texts"], answers, strict=True))
        ],
        "detokenizer_sha256": table_sha,
    }


def _result(token_ids: list[list[int]]) -> dict:
    return {
        **{key: DEVICE[key] for key in ("device_class", "product_type", "driver", "simulated")},
        "device_udid": DEVICE["udid"],
        "load_time_cold_ms": 10.0,
        "load_time_warm_ms": 5.0,
        "peak_memory_bytes": 1 << 20,
        "timing_model": "test",
        "prompts": [
            {
                "prompt_index": index,
                "prompt_tokens": 4,
                "generated_tokens": 3,
                "ttft_ms": 3.0,
                "prefill_tok_s": 100.0,
                "decode_tok_s": 50.0 + index,
                "token_latencies_ms": [1.0, 1.0, 1.0],
                "token_ids": ids,
            }
            for index, ids in enumerate(token_ids)
        ],
    }


def test_a_smollm2_sweep_runs_the_models_tokens_and_shows_its_answers(
    api, user_token, worker_token, agent_token
) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    workers = bearer(worker_token)
    table = dump_table(PIECES)
    table_sha = hashlib.sha256(table).hexdigest()
    assert api.put(f"/api/v1/artifacts/{table_sha}", content=table, headers=workers).is_success
    reference_answers = [[1, 2, 3], [4, 5, 0]]
    for build in sweep["builds"]:
        request = api.get(f"/api/v1/builds/{build['id']}/assignment", headers=workers).json()
        assert request["prompt_set"]["texts"] == SWEEP["prompt_texts"]
        assert request["prompt_set"]["decode_tokens"] == 3
        report = {**build_report(build, MINIMAL_ANALYSIS), "model_identity": "smollm2-135m"}
        refused = start_and_complete(api, build, worker_token, report)  # no references
        assert refused.status_code == 422 and "report.references" in refused.text
        lease = api.post(
            f"/api/v1/builds/{build['id']}/start", json={"worker": "w2"}, headers=workers
        )
        assert not lease.json()["proceed"]  # still held by the first worker's lease
        report["references"] = _references(request["prompt_set"], reference_answers, table_sha)
        done = api.post(
            f"/api/v1/builds/{build['id']}/complete",
            json={"lease": _lease_of(api, build["id"]), "artifact_sha256": table_sha,
                  "report": report},
            headers=workers,
        )  # fmt: skip
        assert done.status_code == 200, done.text

    agents = bearer(agent_token)
    api.post("/api/v1/agents/register", json={"name": "h", "devices": [DEVICE]}, headers=agents)
    # repeat_kv answers like the reference; folded diverges on the second prompt's last token.
    answers = {
        "repeat_kv-ctx256-fp16": reference_answers,
        "folded-ctx256-fp16": [[1, 2, 3], [4, 5, 6]],
    }
    for _ in range(2):
        claim = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agents)
        run = claim.json()["run"]
        assert run["prompt_set_version"] == "custom"
        assert run["prompt_token_ids"] == [[1, 2, 3, 40], [1, 2, 3, 41]]
        stored = api.post(
            f"/api/v1/runs/{run['run_id']}/results",
            json=_result(answers[run["variant_label"]]),
            headers=agents,
        )
        assert stored.status_code == 200, stored.text

    detail = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(user_token)).json()
    agreement = {row["variant"]: row["reference_agreement"] for row in detail["results"]}
    assert agreement["repeat_kv-ctx256-fp16"]["identical_share"] == 1.0
    assert agreement["folded-ctx256-fp16"]["diverging_prompts"] == [1]
    first, second = detail["answers"]["prompts"]
    assert first["reference"] == "The capital is" and second["prompt"] == "Say <hello> & goodbye."
    folded = {answer["variant"]: answer for answer in second["answers"]}["folded-ctx256-fp16"]
    assert folded["text"] == " Paris.\N{GRINNING FACE}" and folded["first_divergence"] == 2

    from decodebench.commands.answers import format_answers
    from decodebench.contracts.api import SweepDetail

    printed = format_answers(SweepDetail.model_validate(detail))  # decodebench status, the demo
    assert "folded-ctx256-fp16 on iphone-17-pro (differs from token 3):\n     Paris." in printed
    assert "50% of 2 prompts identical" in printed

    assert ui_sign_in(api, user_token).status_code == 303
    page = api.get(f"/sweeps/{sweep['id']}").text
    assert 'id="answers"' in page and "Say &lt;hello&gt; &amp; goodbye." in page
    assert " Paris.\N{GRINNING FACE}</pre>" in page and "prompts 1 diverge" in page


def _lease_of(api, build_id: int) -> str:
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().connect() as connection:
        return connection.execute(
            text("SELECT lease_token FROM builds WHERE id = :id"), {"id": build_id}
        ).scalar_one()


@pytest.mark.slow
def test_the_worker_references_smollm2_once_and_its_table_reads_like_the_tokenizer(
    smollm2_folder, tmp_path
) -> None:
    from decodebench.building.reference import reference_set
    from decodebench.building.weights import model_config_from_hf
    from decodebench.contracts.domain import prompt_set_identity
    from decodebench.contracts.presets import SMOLLM2_135M

    config = json.loads((smollm2_folder / "config.json").read_text())
    # The catalog's shape (what a sweep is validated against) is the checkpoint's.
    assert model_config_from_hf(config, SMOLLM2_135M.name) == SMOLLM2_135M
    texts = ["What is the capital of France?", "Écris « bonjour » en japonais."]
    identity = prompt_set_identity(texts, 2, 8)
    outputs, table = reference_set(
        smollm2_folder, "smollm2-135m", texts, 8, identity, "custom", tmp_path
    )
    assert outputs.prompts[0].reference_text.startswith("The capital of France is Paris.")
    assert [len(prompt.reference_ids) for prompt in outputs.prompts] == [8, 8]
    assert table is not None and len(table) == 49152
    for prompt in outputs.prompts:  # the server's decoding equals the tokenizer's
        assert detokenize(table, prompt.reference_ids) == prompt.reference_text
    again, _ = reference_set(smollm2_folder, "smollm2-135m", texts, 8, identity, "custom", tmp_path)
    assert again == outputs and len(list(tmp_path.glob("references-*.json"))) == 1
    # A context too small for the whole prompt: the reference is of the tokens the device gets.
    cut, _ = reference_set(
        smollm2_folder, "smollm2-135m", texts[:1], 2, identity, "custom", tmp_path, 12
    )
    assert cut.prompts[0].token_ids == outputs.prompts[0].token_ids[-12:]


def test_a_presets_own_prompts_are_pseudo_tokenized_by_the_agent() -> None:
    from agent.runner import prompt_ids
    from decodebench.contracts.protocol import RunAssignment
    from decodebench.prompts import pseudo_tokenize

    assignment = RunAssignment(
        run_id=1, sweep_id=1, build_id=1, model="tiny-gqa", variant=VariantSpec(context=64),
        variant_label="v", device_class="iphone-17-pro", prompts=2, decode_tokens=4,
        artifact_sha256="0" * 64, artifact_url="http://x", bytes_per_token=1,
        lease_expires_at="2026-01-01T00:00:00+00:00", lease_seconds=60,
        prompt_set_version="custom", prompt_texts=["Hello there", "¿Qué tal?"],
    )  # fmt: skip
    assert prompt_ids(assignment, 512) == [
        pseudo_tokenize(t, 512) for t in ["Hello there", "¿Qué tal?"]
    ]
    carried = assignment.model_copy(update={"prompt_token_ids": [[1, 2], [3, 600]]})
    with pytest.raises(ValueError, match="outside the vocabulary of 512"):
        prompt_ids(carried, 512)


def test_nul_in_any_request_text_is_a_422_not_a_500(api, agent_token, user_token) -> None:
    """PostgreSQL cannot store U+0000 in text or JSONB: refused where it arrives."""
    before = table_counts()
    register = {"name": "\x00", "devices": []}
    answer = api.post("/api/v1/agents/register", json=register, headers=bearer(agent_token))
    assert answer.status_code == 422 and "NUL" in answer.text
    texts = {**SWEEP, "prompt_texts": ["a\x00b"]}
    assert api.post("/api/v1/sweeps", json=texts, headers=bearer(user_token)).status_code == 422
    assert table_counts() == before
