"""SmolLM2-135M end to end: real prompts, the fp32 reference, and fp16 packages that agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodebench.building.agreement import measure_agreement
from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.building.reference import reference_outputs
from decodebench.contracts.domain import Attention, KVCache, VariantSpec
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.prompts import (
    CHAT_PROMPT_COUNT,
    chat_prompts,
    has_tokenizer,
    prompt_token_ids,
)

CONTEXT = 256
STEPS = 16


@pytest.fixture(scope="module")
def chat_ids(smollm2_folder: Path) -> list[list[int]]:
    return prompt_token_ids(chat_prompts(), 49152, smollm2_folder)


def test_chat_prompts_use_the_models_template_and_fit_the_context(
    smollm2_folder: Path, chat_ids: list[list[int]]
) -> None:
    assert has_tokenizer(smollm2_folder) and not has_tokenizer(None)
    assert len(chat_ids) == CHAT_PROMPT_COUNT == 30
    starts = {tuple(ids[:3]) for ids in chat_ids}
    assert len(starts) == 1  # every prompt opens with the template's system turn
    assert all(len(ids) + STEPS <= CONTEXT for ids in chat_ids)
    assert len({len(ids) for ids in chat_ids}) > 10  # varied lengths
    pseudo = prompt_token_ids(chat_prompts(2), 49152, None)
    assert pseudo == [prompt.token_ids(49152) for prompt in chat_prompts(2)]


def test_reference_answers_the_capital_question(smollm2_folder: Path, chat_ids) -> None:  # noqa: ANN001
    from decodebench.prompts import decode_text

    (answer,) = reference_outputs(smollm2_folder, chat_ids[:1], 8)
    assert decode_text(smollm2_folder, answer).startswith("The capital of France is Paris.")


@pytest.fixture(scope="module")
def smollm2_builds(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = tmp_path_factory.mktemp("smollm2")
    reports = {}
    with quiet_coremltools():
        for attention, kv in (
            (Attention.repeat_kv, KVCache.state),
            (Attention.folded, KVCache.input),
        ):
            variant = VariantSpec(attention=attention, kv=kv, context=CONTEXT)
            out = root / f"{attention.value}-{kv.value}"
            reports[(attention, kv)] = (
                build_variant("smollm2-135m", variant, out, weights=smollm2_folder),
                out / PACKAGE_NAME,
            )
    return reports


@pytest.mark.slow
def test_tiles_go_from_sixty_to_none(smollm2_builds) -> None:  # noqa: ANN001
    repeat, _ = smollm2_builds[(Attention.repeat_kv, KVCache.state)]
    folded, _ = smollm2_builds[(Attention.folded, KVCache.input)]
    assert repeat.analysis.tile_ops == 60  # the K and V caches of 30 layers
    assert folded.analysis.tile_ops == 0
    assert folded.analysis.unknown_ops == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "attention, kv", [(Attention.repeat_kv, KVCache.state), (Attention.folded, KVCache.input)]
)
def test_fp16_package_decodes_the_fp32_reference_tokens(
    smollm2_folder: Path,
    chat_ids,
    smollm2_builds,
    attention: Attention,
    kv: KVCache,  # noqa: ANN001
) -> None:
    prompts = chat_ids[:1]  # one prompt keeps the suite short; bench/smollm2_agreement.py runs more
    references = reference_outputs(smollm2_folder, prompts, STEPS)
    _, package = smollm2_builds[(attention, kv)]
    report = measure_agreement(package, prompts, references, STEPS)
    assert report.non_finite == 0
    assert [result.tokens for result in report.prompts] == references
